package loadgen

import (
	"math"
	"math/rand/v2"
	"time"
)

// z99 is the standard normal's 99th percentile.
const z99 = 2.326

// LLMShape describes LLM-shaped requests: service times drawn from a
// log-normal (its median and 99th percentile given), streamed one token
// per TokenTime, and prompt sizes drawn uniformly between two bounds.
// Its zero fields take the defaults of DefaultLLMShape.
type LLMShape struct {
	// Median and P99 place the log-normal of the service times:
	// mu = ln(Median), sigma = ln(P99/Median) / 2.326.
	Median time.Duration `json:"median_ns"`
	P99    time.Duration `json:"p99_ns"`
	// MaxService caps a draw (the log-normal's tail is unbounded); with
	// the defaults, 60 s is 4.1 sigma above the median: about 2 draws in
	// 100,000 are capped.
	MaxService time.Duration `json:"max_service_ns"`
	// TokenTime is the time per streamed token (X-Mock-Delay).
	TokenTime time.Duration `json:"token_time_ns"`
	// MinPrompt and MaxPrompt bound the prompt sizes, in bytes
	// (inclusive).
	MinPrompt int `json:"min_prompt_bytes"`
	MaxPrompt int `json:"max_prompt_bytes"`
}

// DefaultLLMShape is a chat model's traffic: median 1 s, p99 10 s,
// 20 ms per token, prompts of 1 to 32 KiB.
var DefaultLLMShape = LLMShape{
	Median: time.Second, P99: 10 * time.Second, MaxService: time.Minute,
	TokenTime: 20 * time.Millisecond, MinPrompt: 1 << 10, MaxPrompt: 32 << 10,
}

// withDefaults fills in the zero fields of s.
func (s LLMShape) withDefaults() LLMShape {
	d := DefaultLLMShape
	if s.Median <= 0 {
		s.Median = d.Median
	}
	if s.P99 <= s.Median {
		s.P99 = max(d.P99, s.Median*10)
	}
	if s.MaxService <= 0 {
		s.MaxService = max(d.MaxService, s.P99*6)
	}
	if s.TokenTime <= 0 {
		s.TokenTime = d.TokenTime
	}
	if s.MinPrompt <= 0 {
		s.MinPrompt = d.MinPrompt
	}
	if s.MaxPrompt < s.MinPrompt {
		s.MaxPrompt = max(d.MaxPrompt, s.MinPrompt)
	}
	return s
}

// Mu and Sigma are the parameters of the log-normal of the service
// times, in ln(seconds).
func (s LLMShape) Mu() float64 { return math.Log(s.withDefaults().Median.Seconds()) }

// Sigma: see Mu.
func (s LLMShape) Sigma() float64 {
	s = s.withDefaults()
	return math.Log(float64(s.P99)/float64(s.Median)) / z99
}

// MeanService is the log-normal's mean, exp(mu + sigma^2/2): 1.63 s with
// the defaults (the cap left out).
func (s LLMShape) MeanService() time.Duration {
	mu, sigma := s.Mu(), s.Sigma()
	return time.Duration(math.Exp(mu+sigma*sigma/2) * float64(time.Second))
}

// Tokens is the number of tokens that stream a service time:
// max(1, round(service / TokenTime)).
func (s LLMShape) Tokens(service time.Duration) int {
	s = s.withDefaults()
	return max(1, int(math.Round(float64(service)/float64(s.TokenTime))))
}

// Sampler draws requests of an LLMShape from a fixed seed: the same seed
// gives the same sequence.
type Sampler struct {
	shape     LLMShape
	mu, sigma float64
	rng       *rand.Rand
}

// NewSampler returns a sampler of shape seeded with seed.
func NewSampler(shape LLMShape, seed uint64) *Sampler {
	shape = shape.withDefaults()
	return &Sampler{
		shape: shape, mu: shape.Mu(), sigma: shape.Sigma(),
		rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
	}
}

// Service draws a service time from the log-normal, capped at
// MaxService.
func (sm *Sampler) Service() time.Duration {
	d := time.Duration(math.Exp(sm.mu+sm.sigma*sm.rng.NormFloat64()) * float64(time.Second))
	return min(d, sm.shape.MaxService)
}

// Prompt draws a prompt size, uniform in [MinPrompt, MaxPrompt].
func (sm *Sampler) Prompt() int {
	return sm.shape.MinPrompt + sm.rng.IntN(sm.shape.MaxPrompt-sm.shape.MinPrompt+1)
}

// Request draws one request (At left zero): a service time streamed as
// Tokens(service) tokens of TokenTime, and a prompt size.
func (sm *Sampler) Request() Arrival {
	return Arrival{
		Tokens:      sm.shape.Tokens(sm.Service()),
		Delay:       sm.shape.TokenTime,
		PromptBytes: sm.Prompt(),
	}
}

// Interarrival draws the time to the next arrival of a Poisson process of
// rate per second (exponential, mean 1/rate).
func (sm *Sampler) Interarrival(rate float64) time.Duration {
	return time.Duration(sm.rng.ExpFloat64() / rate * float64(time.Second))
}

// Plan is a scheduled open loop of LLM-shaped requests at a fraction of
// the capacity of some permits.
type Plan struct {
	// Load is the fraction of capacity asked for; Permits the permits
	// the capacity is of.
	Load    float64 `json:"load"`
	Permits int     `json:"permits"`
	// Rate is the arrival rate, per second: len(Arrivals) / Duration,
	// which is Load x Permits / MeanService up to the rounding of the
	// count.
	Rate float64 `json:"rate_rps"`
	// MeanService is the mean service time of the arrivals drawn (tokens
	// x token time), the sample mean; MeanServiceModel the log-normal's.
	MeanService      time.Duration `json:"mean_service_ns"`
	MeanServiceModel time.Duration `json:"mean_service_model_ns"`
	// Work is the permit-time the arrivals need, their services summed:
	// Load x Permits x Duration, up to one request.
	Work time.Duration `json:"work_ns"`
	// Arrivals is the schedule (Config.Schedule), all before Duration.
	Arrivals []Arrival     `json:"-"`
	Duration time.Duration `json:"duration_ns"`
}

// NewPlan draws a plan from seed: Poisson arrivals for d at load x the
// capacity of permits, the capacity being permits / the sample mean
// service time of the requests drawn, so that the work offered is
// load x permits x d.
//
// It draws requests until their services sum to that work (the count n
// whose sum is nearest), then places the n arrivals as a Poisson process
// conditioned on n arrivals in [0, d): the partial sums of n+1
// exponential gaps, scaled so that the n+1-th falls at d (the n arrival
// times are then distributed as n sorted uniform draws on [0, d), the
// gaps exponential of mean d/(n+1) but for their sum). Left free, the
// count of a 40 s point at 8 permits has a standard deviation of about
// 7%, and so would the load offered.
//
// The requests (service, prompt) come from one stream of seed and the
// gaps from another. The same arguments give the same plan.
func NewPlan(shape LLMShape, seed uint64, permits int, load float64, d time.Duration) Plan {
	shape = shape.withDefaults()
	reqs := NewSampler(shape, seed)
	gaps := NewSampler(shape, seed^0x5851f42d4c957f2d)
	p := Plan{Load: load, Permits: permits, MeanServiceModel: shape.MeanService(), Duration: d}
	target := time.Duration(load * float64(permits) * float64(d))
	var requests []Arrival
	var work time.Duration
	for work < target {
		r := reqs.Request()
		service := time.Duration(r.Tokens) * r.Delay
		// Stop before a request that overshoots more than leaving it
		// out falls short.
		if len(requests) > 0 && work+service-target > target-work {
			break
		}
		requests = append(requests, r)
		work += service
	}
	n := len(requests)
	if n == 0 {
		return p
	}
	units := make([]float64, n+1)
	var total float64
	for i := range units {
		units[i] = gaps.rng.ExpFloat64()
		total += units[i]
	}
	p.Arrivals = make([]Arrival, n)
	t := 0.0
	for i, r := range requests {
		t += units[i]
		r.At = time.Duration(t / total * float64(d))
		p.Arrivals[i] = r
	}
	p.Work = work
	p.MeanService = work / time.Duration(n)
	p.Rate = float64(n) / d.Seconds()
	return p
}
