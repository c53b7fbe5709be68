package loadgen

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// within reports whether got is within frac of want.
func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*math.Abs(want) }

func TestLLMShapeParameters(t *testing.T) {
	t.Parallel()
	s := DefaultLLMShape
	assert.InDelta(t, 0, s.Mu(), 1e-12, "mu = ln 1 s")
	assert.InDelta(t, math.Log(10)/2.326, s.Sigma(), 1e-12)
	assert.InDelta(t, 1.63, s.MeanService().Seconds(), 0.01, "exp(mu + sigma^2/2)")
	// Zero fields take the defaults.
	assert.Equal(t, s.Sigma(), LLMShape{}.Sigma())
}

func TestSamplerServiceDistribution(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		shape       LLMShape
		median, p99 time.Duration
	}{
		{"default 1 s / 10 s", DefaultLLMShape, time.Second, 10 * time.Second},
		{"200 ms / 4 s", LLMShape{Median: 200 * time.Millisecond, P99: 4 * time.Second}, 200 * time.Millisecond, 4 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const n = 100_000
			sm := NewSampler(c.shape, 42)
			ds := make([]time.Duration, n)
			var sum time.Duration
			for i := range ds {
				ds[i] = sm.Service()
				sum += ds[i]
			}
			slices.Sort(ds)
			med, p99 := Percentile(ds, 50), Percentile(ds, 99)
			assert.True(t, within(med.Seconds(), c.median.Seconds(), 0.03), "median %v, want %v +-3%%", med, c.median)
			assert.True(t, within(p99.Seconds(), c.p99.Seconds(), 0.05), "p99 %v, want %v +-5%%", p99, c.p99)
			mean := (sum / n).Seconds()
			assert.True(t, within(mean, c.shape.MeanService().Seconds(), 0.03), "mean %.3f s, want %v", mean, c.shape.MeanService())
			assert.LessOrEqual(t, ds[n-1], c.shape.withDefaults().MaxService, "capped")
		})
	}
}

func TestSamplerPromptsUniform(t *testing.T) {
	t.Parallel()
	sm := NewSampler(DefaultLLMShape, 7)
	const n = 100_000
	lo, hi := DefaultLLMShape.MinPrompt, DefaultLLMShape.MaxPrompt
	var sum float64
	minSeen, maxSeen := hi, lo
	for range n {
		p := sm.Prompt()
		require.GreaterOrEqual(t, p, lo)
		require.LessOrEqual(t, p, hi)
		minSeen, maxSeen = min(minSeen, p), max(maxSeen, p)
		sum += float64(p)
	}
	assert.True(t, within(sum/n, float64(lo+hi)/2, 0.01), "mean prompt %.0f", sum/n)
	assert.Less(t, minSeen, lo+512)
	assert.Greater(t, maxSeen, hi-512)
}

func TestTokens(t *testing.T) {
	t.Parallel()
	s := DefaultLLMShape // 20 ms per token
	cases := []struct {
		service time.Duration
		want    int
	}{
		{0, 1},
		{time.Millisecond, 1},
		{9 * time.Millisecond, 1},
		{29 * time.Millisecond, 1},
		{30 * time.Millisecond, 2}, // 1.5 rounds half away from zero
		{40 * time.Millisecond, 2},
		{time.Second, 50},
		{1010 * time.Millisecond, 51},
		{10 * time.Second, 500},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, s.Tokens(c.service), "%v", c.service)
	}
	r := NewSampler(s, 1).Request()
	assert.Equal(t, 20*time.Millisecond, r.Delay)
	assert.GreaterOrEqual(t, r.Tokens, 1)
}

func TestSamplerDeterministic(t *testing.T) {
	t.Parallel()
	draw := func(seed uint64) []Arrival {
		sm := NewSampler(DefaultLLMShape, seed)
		out := make([]Arrival, 1000)
		for i := range out {
			out[i] = sm.Request()
			out[i].At = sm.Interarrival(5)
		}
		return out
	}
	assert.Equal(t, draw(3), draw(3), "same seed, same sequence")
	assert.NotEqual(t, draw(3), draw(4), "another seed, another sequence")

	p1 := NewPlan(DefaultLLMShape, 11, 8, 0.9, 40*time.Second)
	p2 := NewPlan(DefaultLLMShape, 11, 8, 0.9, 40*time.Second)
	assert.Equal(t, p1, p2, "same seed, same plan")
	assert.NotEqual(t, p1.Arrivals, NewPlan(DefaultLLMShape, 12, 8, 0.9, 40*time.Second).Arrivals)
}

func TestSamplerPoissonInterarrival(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0.5, 5, 500} {
		sm := NewSampler(DefaultLLMShape, 99)
		const n = 100_000
		var sum, sumSq float64
		for range n {
			g := sm.Interarrival(rate).Seconds()
			sum += g
			sumSq += g * g
		}
		mean := sum / n
		sd := math.Sqrt(sumSq/n - mean*mean)
		assert.True(t, within(mean, 1/rate, 0.02), "rate %v: mean gap %.4f s, want %.4f", rate, mean, 1/rate)
		assert.True(t, within(sd, 1/rate, 0.03), "rate %v: exponential, sd = mean: %.4f", rate, sd)
	}
}

func TestPlanOffersItsLoad(t *testing.T) {
	t.Parallel()
	cases := []struct {
		load    float64
		permits int
		d       time.Duration
	}{
		{0.7, 8, 40 * time.Second},
		{0.9, 8, 40 * time.Second},
		{1.0, 8, 40 * time.Second},
		{1.1, 8, 40 * time.Second},
		{1.0, 4, 8 * time.Second},
	}
	for _, c := range cases {
		var offs []float64
		for seed := uint64(1); seed <= 20; seed++ {
			p := NewPlan(DefaultLLMShape, seed, c.permits, c.load, c.d)
			require.NotEmpty(t, p.Arrivals)
			target := c.load * float64(c.permits) * c.d.Seconds()
			var sum time.Duration
			longest := time.Duration(0)
			for i, a := range p.Arrivals {
				require.Less(t, a.At, c.d)
				require.GreaterOrEqual(t, a.At, time.Duration(0))
				if i > 0 {
					require.GreaterOrEqual(t, a.At, p.Arrivals[i-1].At)
				}
				s := time.Duration(a.Tokens) * a.Delay
				sum += s
				longest = max(longest, s)
			}
			assert.Equal(t, p.Work, sum)
			assert.Equal(t, sum/time.Duration(len(p.Arrivals)), p.MeanService)
			// The work offered is the load's: the prefix of the request
			// stream whose sum is nearest (off by half a request at most).
			n := len(p.Arrivals)
			reqs := NewSampler(DefaultLLMShape, seed)
			prefix := make([]float64, n+2) // prefix[k]: the first k services summed, s
			for k := 1; k <= n+1; k++ {
				r := reqs.Request()
				if k <= n {
					a := p.Arrivals[k-1]
					require.Equal(t, Arrival{Tokens: r.Tokens, Delay: r.Delay, PromptBytes: r.PromptBytes, At: a.At}, a)
				}
				prefix[k] = prefix[k-1] + (time.Duration(r.Tokens) * r.Delay).Seconds()
			}
			off := func(k int) float64 { return math.Abs(prefix[k] - target) }
			assert.InDelta(t, prefix[n], p.Work.Seconds(), 1e-6)
			assert.LessOrEqual(t, off(n), off(n+1), "%+v seed %d", c, seed)
			assert.LessOrEqual(t, off(n), off(n-1), "%+v seed %d", c, seed)
			assert.LessOrEqual(t, off(n), longest.Seconds()/2+(prefix[n+1]-prefix[n])/2)
			offs = append(offs, off(n))
			// The rate is load x the capacity of the sample mean, as
			// closely as the work.
			assert.InDelta(t, c.load*float64(c.permits)/p.MeanService.Seconds(), p.Rate,
				p.Rate*(math.Abs(p.Work.Seconds()-target)/p.Work.Seconds()+1e-9), "%+v seed %d", c, seed)
			assert.InDelta(t, float64(len(p.Arrivals))/c.d.Seconds(), p.Rate, 1e-9)
		}
		// Typically within one mean request (the request at the boundary
		// is size-biased: ~4 s on average); a free Poisson count would be
		// off by sqrt(n) requests, ~14 at 40 s and 8 permits.
		slices.Sort(offs)
		assert.Less(t, offs[len(offs)/2], DefaultLLMShape.MeanService().Seconds(), "%+v: median error of the work, s", c)
	}
}

func TestPlanArrivalsArePoisson(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		load float64
		d    time.Duration
	}{
		{"load 0.7", 0.7, 2000 * time.Second},
		{"load 1.1", 1.1, 2000 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := NewPlan(DefaultLLMShape, 5, 8, c.load, c.d)
			n := len(p.Arrivals)
			require.Greater(t, n, 5000)
			gaps := make([]float64, n)
			prev := time.Duration(0)
			var sum, sumSq float64
			for i, a := range p.Arrivals {
				gaps[i] = (a.At - prev).Seconds()
				prev = a.At
				sum += gaps[i]
				sumSq += gaps[i] * gaps[i]
			}
			mean := sum / float64(n)
			sd := math.Sqrt(sumSq/float64(n) - mean*mean)
			assert.True(t, within(mean, 1/p.Rate, 0.03), "mean gap %.4f s, 1/rate %.4f s", mean, 1/p.Rate)
			assert.True(t, within(sd/mean, 1, 0.05), "exponential gaps: sd/mean %.3f", sd/mean)
			// Memoryless: P(gap > mean) = 1/e.
			over := 0
			for _, g := range gaps {
				if g > mean {
					over++
				}
			}
			assert.InDelta(t, math.Exp(-1), float64(over)/float64(n), 0.02)
		})
	}
}

func TestScheduledOpenLoop(t *testing.T) {
	t.Parallel()
	m, u := startMock(t)
	sched := []Arrival{
		{At: 0, Tokens: 1, Delay: time.Millisecond, PromptBytes: 100},
		{At: 20 * time.Millisecond, Tokens: 3, Delay: 10 * time.Millisecond, PromptBytes: 2000},
		{At: 40 * time.Millisecond, Tokens: -1, Delay: -1},
		{At: 5 * time.Second}, // after Duration: not sent
	}
	start := time.Now()
	rep := run(t, Config{Targets: []string{u}, Schedule: sched, Duration: time.Second, Stream: true, Tokens: 2, Delay: time.Millisecond})
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Equal(t, 3, rep.Sent)
	assert.Equal(t, 3, rep.OK)
	assert.Equal(t, 3, m.Served())
	byArrival := map[int]Result{}
	for _, res := range rep.All() {
		byArrival[res.Arrival] = res
	}
	require.Len(t, byArrival, 3)
	assert.GreaterOrEqual(t, byArrival[1].Start, 20*time.Millisecond)
	assert.GreaterOrEqual(t, byArrival[1].Total, 30*time.Millisecond, "3 tokens x 10 ms")
	assert.GreaterOrEqual(t, byArrival[2].Start, 40*time.Millisecond)

	_, err := New(Config{Targets: []string{u}, Schedule: sched, Rate: 5, Duration: time.Second})
	assert.Error(t, err, "a schedule and a rate")
	_, err = New(Config{Targets: []string{u}, Schedule: []Arrival{{At: time.Second}, {At: 0}}})
	assert.Error(t, err, "out of order")
	c, err := New(Config{Targets: []string{u}, Schedule: sched[:1]})
	require.NoError(t, err)
	assert.True(t, c.Config().Open())
}
