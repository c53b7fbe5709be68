// Package report holds what a bench run measured and how it is told:
// the types of results.json (Results, and each scenario's settings and
// figures), the targets and their checks (Evaluate), BENCHMARKS.md
// (Markdown) and the PNG plots (WritePlots). It runs nothing, so that
// bench -render rebuilds the report from a results.json alone.
package report

import (
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
)

// Results is everything a run measured: bench-results/results.json.
type Results struct {
	// Mode is "quick" or "full".
	Mode string `json:"mode"`
	// Started is when the run started; Elapsed its length in seconds.
	Started time.Time `json:"started"`
	Elapsed float64   `json:"elapsed_s"`
	// Machine is where it ran; Settings the loads it ran.
	Machine  Machine  `json:"machine"`
	Settings Settings `json:"settings"`
	// Systems holds one entry per system under test, in run order.
	Systems []*System `json:"systems"`
	// Waiters holds the many-waiters measurements.
	Waiters []*WaiterRun `json:"waiters"`
	// Fairness is the fairness scenario: tenants' shares per queue mode.
	Fairness *Fairness `json:"fairness,omitempty"`
	// LLM is the LLM-shaped scenario: utilization and wait per load.
	LLM *LLM `json:"llm,omitempty"`
	// Configs is the config scenario: the bench's JSON and a Caddyfile,
	// alternated.
	Configs *Configs `json:"configs,omitempty"`
	// Scale is the scale scenario: tens of thousands of waiters over 3
	// nodes, and many queues on one Redis.
	Scale *Scale `json:"scale,omitempty"`
	// Capacity is the capacity scenario: fixed permits in front of a
	// GPU-shaped backend.
	Capacity *Capacity `json:"capacity,omitempty"`
	// Checks are the targets of the benchmark issue, each pass/fail/n/a.
	Checks []Check `json:"checks"`
}

// Settings are the load parameters of a run.
type Settings struct {
	// Permits is the permits of every limiter (HAProxy maxconn too).
	Permits int `json:"permits"`
	// ServiceMS is the upstream's time per unstreamed answer.
	ServiceMS float64 `json:"service_ms"`
	// ShortServiceMS is the upstream's time per answer of the short
	// saturated load (embeddings, rerankers, small models, cached
	// answers): the handoff is a larger share of a permit's turn. Zero:
	// not run (a run before the bench had it).
	ShortServiceMS float64 `json:"short_service_ms,omitempty"`
	// Clients is the closed-loop concurrency of the saturated loads.
	Clients int `json:"clients"`
	// SaturatedS, LowLoadS and OpenLoopS are the lengths of a saturated
	// load, of the low load and of one open-loop point, in seconds.
	SaturatedS float64 `json:"saturated_s"`
	LowLoadS   float64 `json:"low_load_s"`
	OpenLoopS  float64 `json:"open_loop_s"`
	// OpenLoopLoads are the arrival rates, as fractions of
	// UpstreamStreamRPS.
	OpenLoopLoads []float64 `json:"open_loop_loads"`
	// Waiters is the number of requests queued by the waiters runs.
	Waiters int `json:"waiters"`
	// IdleWindowS is how long Redis commands are counted while the
	// waiters wait.
	IdleWindowS float64 `json:"idle_window_s"`
	// MaxWaitS is fair_queue's max_wait and HAProxy's timeout queue.
	MaxWaitS float64 `json:"max_wait_s"`
	// StreamTokens and StreamTokenMS shape a streamed answer.
	StreamTokens  int     `json:"stream_tokens"`
	StreamTokenMS float64 `json:"stream_token_ms"`
	// LowLoadClients and LowLoadDelayMS shape the low load.
	LowLoadClients int     `json:"low_load_clients"`
	LowLoadDelayMS float64 `json:"low_load_delay_ms"`
	// StreamSaturated adds a saturated load with streamed answers.
	StreamSaturated bool `json:"stream_saturated"`
	// UpstreamRPS and UpstreamStreamRPS are the throughput of mockllm
	// alone with Permits clients, unstreamed and streamed: the ceiling of
	// every limiter. The open-loop rates are fractions of the latter.
	UpstreamRPS       float64 `json:"upstream_rps"`
	UpstreamStreamRPS float64 `json:"upstream_stream_rps"`
	// UpstreamShortRPS is the same with ShortServiceMS answers.
	UpstreamShortRPS float64 `json:"upstream_short_rps,omitempty"`
	// RedisRTTP50MS and RedisRTTP99MS are the round trip of one no-op
	// script call to the bench's Redis from a Go client (go-redis, as
	// fair_queue uses), each call after 0.5 ms without one, as at low
	// load: the least a queue shared through Redis adds to a request
	// (fair_queue's fast path makes one such call before the upstream,
	// its release one after the answer). RedisRTTBusyP50MS is the same
	// back to back, when neither side's CPU idles between calls.
	RedisRTTP50MS     float64 `json:"redis_rtt_p50_ms"`
	RedisRTTP99MS     float64 `json:"redis_rtt_p99_ms"`
	RedisRTTBusyP50MS float64 `json:"redis_rtt_busy_p50_ms"`
	// WaiterRampRPS is the arrival rate of the many waiters, lowered for
	// large prompts to send at most WaiterRampMiBps of them.
	WaiterRampRPS   float64 `json:"waiter_ramp_rps"`
	WaiterRampMiBps float64 `json:"waiter_ramp_mib_per_s"`
	// Bursts add waiters runs arriving that fast, which check only that
	// no waiter gets in without a permit.
	Bursts []Burst `json:"bursts,omitempty"`
}

// Burst is a fast arrival of waiters.
type Burst struct {
	// PromptBytes is the prompt size of each waiter.
	PromptBytes int `json:"prompt_bytes"`
	// RPS is their arrival rate.
	RPS float64 `json:"rps"`
}

// System holds the measurements of one system under test.
type System struct {
	// Spec is the system.
	Spec systems.Spec `json:"spec"`
	// Error says why the system could not be measured.
	Error string `json:"error,omitempty"`
	// LowLoad is one client sending back-to-back requests with an
	// instant upstream: every request takes the fast path.
	LowLoad *LoadRun `json:"low_load,omitempty"`
	// Saturated is Clients clients against Permits permits of a
	// ServiceMS upstream, unstreamed answers.
	Saturated *LoadRun `json:"saturated,omitempty"`
	// AtPermits is plain reverse_proxy only: Permits clients against the
	// ServiceMS upstream, unstreamed answers, as long as Saturated: the
	// limiters' upstream concurrency and about their throughput without
	// a queue, the reference of their CPU per request when saturated
	// (reverse_proxy's own Saturated load serves several times as many
	// requests per second, which costs less CPU each).
	AtPermits *LoadRun `json:"at_permits,omitempty"`
	// UpstreamQueues is plain reverse_proxy only: the Saturated load
	// against an upstream that queues what exceeds Permits itself
	// (mockllm's slots, as a model server's own queue does): the same
	// clients, client connections, upstream concurrency and about the
	// same throughput as a limiter's (reverse_proxy keeps a connection
	// to the upstream per waiting request), with the queue in the upstream instead
	// of the proxy. The reference of the limiters' CPU per request when
	// saturated.
	UpstreamQueues *LoadRun `json:"upstream_queues,omitempty"`
	// SaturatedShort is the Saturated load with ShortServiceMS answers
	// (limiters); UpstreamQueuesShort the UpstreamQueues load with them
	// (plain reverse_proxy only).
	SaturatedShort      *LoadRun `json:"saturated_short,omitempty"`
	UpstreamQueuesShort *LoadRun `json:"upstream_queues_short,omitempty"`
	// SaturatedStream is the same with streamed answers.
	SaturatedStream *LoadRun `json:"saturated_stream,omitempty"`
	// OpenLoop holds one point per arrival rate, streamed answers.
	OpenLoop []*RatePoint `json:"open_loop,omitempty"`
}

// LoadRun is the outcome of one closed-loop load.
type LoadRun struct {
	// Requests, OK, Rejected and Failed count requests by outcome.
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	// Elapsed is the load's length in seconds, Throughput its OK
	// requests per second.
	Elapsed    float64 `json:"elapsed_s"`
	Throughput float64 `json:"throughput_rps"`
	// P50, P90, P99 and Max are the total latencies of OK requests, ms.
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// CDF holds latency quantiles in ms at 0.5%, 1%, ... 100%.
	CDF []float64 `json:"cdf_ms,omitempty"`
	// UpstreamMax is the upstream's highest concurrency (mockllm /stats).
	UpstreamMax int `json:"upstream_max_in_flight"`
	// Utilization is busy permit-time / (Permits x wall time), limiters
	// only.
	Utilization float64 `json:"permit_utilization,omitempty"`
	// HandoffCount, HandoffP50 and HandoffP99 describe the gaps from a
	// completion's end to the upstream arrival of the request that took
	// its slot, in ms (mockllm -timeline), limiters only.
	HandoffCount int     `json:"handoff_count,omitempty"`
	HandoffP50   float64 `json:"handoff_p50_ms,omitempty"`
	HandoffP99   float64 `json:"handoff_p99_ms,omitempty"`
	// ScriptsPerRequest and CommandsPerRequest are Redis script calls
	// and all commands executed (those inside scripts included) per
	// request, all nodes together; Commands the raw INFO commandstats
	// delta. Redis systems only.
	ScriptsPerRequest  float64          `json:"redis_scripts_per_request,omitempty"`
	CommandsPerRequest float64          `json:"redis_commands_per_request,omitempty"`
	Commands           map[string]int64 `json:"redis_commands,omitempty"`
	// ProxyCPUMS is the user+system CPU time the system's proxy
	// processes (every Caddy node, or haproxy) consumed over the load's
	// window, in ms (/proc/<pid>/stat); RedisCPUMS the same of
	// redis-server, Redis systems only. CPURequests is the requests
	// answered in that window (OK and rejected), ProxyCPUPerRequest and
	// RedisCPUPerRequest the CPU times divided by it, in ms. Zero: not
	// measured (a run before the bench measured CPU).
	CPURequests        int     `json:"cpu_requests,omitempty"`
	ProxyCPUMS         float64 `json:"proxy_cpu_ms,omitempty"`
	RedisCPUMS         float64 `json:"redis_cpu_ms,omitempty"`
	ProxyCPUPerRequest float64 `json:"proxy_cpu_ms_per_request,omitempty"`
	RedisCPUPerRequest float64 `json:"redis_cpu_ms_per_request,omitempty"`
}

// TotalCPUPerRequest is the CPU per request of the proxies and of Redis
// together, in ms.
func (run *LoadRun) TotalCPUPerRequest() float64 {
	return run.ProxyCPUPerRequest + run.RedisCPUPerRequest
}

// RatePoint is one open-loop load at a fixed arrival rate.
type RatePoint struct {
	// Rate is the arrival rate; Load that rate / UpstreamStreamRPS.
	Rate float64 `json:"rate_rps"`
	Load float64 `json:"load"`
	// Sent, OK, Rejected and Failed count requests by outcome.
	Sent     int `json:"sent"`
	OK       int `json:"ok"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	// Throughput is OK requests per second.
	Throughput float64 `json:"throughput_rps"`
	// WaitP50 and WaitP99 are the time to first byte of a streamed
	// answer: the time spent queued, plus the proxy's own latency.
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP99 float64 `json:"wait_p99_ms"`
}

// WaiterRun measures one system holding many idle waiters: all permits
// held by long streams, Waiters requests queued behind them.
type WaiterRun struct {
	// System is the spec name; Waiters and PromptBytes the load.
	System      string `json:"system"`
	Waiters     int    `json:"waiters"`
	PromptBytes int    `json:"prompt_bytes"`
	// RampRPS is the waiters' arrival rate; Burst marks the run of
	// Settings.Bursts, which check admission only.
	RampRPS float64 `json:"ramp_rps"`
	Burst   bool    `json:"burst,omitempty"`
	// Queued is how many were seen waiting (Redis ZCARD, or connected).
	Queued int64 `json:"queued"`
	// RSSBefore and RSSAfter are the node's VmRSS before and after
	// queueing them; RSSPerWaiter the difference per waiter, in KiB.
	RSSBefore    int64   `json:"rss_before_bytes"`
	RSSAfter     int64   `json:"rss_after_bytes"`
	RSSPerWaiter float64 `json:"rss_per_waiter_kb"`
	// BaseWaiters waited while BaseCmdsPerS was measured; IdleCmdsPerS
	// and IdleScripts are Redis commands and script calls per second
	// with all the waiters queued, over IdleWindowSec.
	BaseWaiters   int     `json:"base_waiters,omitempty"`
	BaseCmdsPerS  float64 `json:"redis_cmds_per_s_base,omitempty"`
	IdleCmdsPerS  float64 `json:"redis_cmds_per_s,omitempty"`
	IdleScripts   float64 `json:"redis_scripts_per_s,omitempty"`
	IdleWindowSec float64 `json:"idle_window_s,omitempty"`
	// UpstreamMax is the upstream's highest concurrency during the run:
	// more than the permits means requests were admitted without one.
	UpstreamMax int `json:"upstream_max_in_flight"`
	// Served, Failed and Rejected count waiters that got an answer
	// (granted: admitted without a permit, since every permit was held),
	// an error, or a reject before the run ended.
	Served   int64 `json:"served"`
	Failed   int64 `json:"failed"`
	Rejected int64 `json:"rejected"`
	// Reasons counts the rejects by Fair-Queue-Reason, over the whole run.
	Reasons map[string]int `json:"reasons,omitempty"`
	// Note says what went wrong, if anything.
	Note string `json:"note,omitempty"`
}

// Check is one target of the benchmark issue for one system.
type Check struct {
	// Target is one of the Target constants.
	Target string `json:"target"`
	// System names the system (and the waiters run) checked.
	System string `json:"system"`
	// Value is what was measured, in words.
	Value string `json:"value"`
	// Result is "pass", "FAIL", "n/a" or, for a figure shown beside a
	// target but not held to it, "reported".
	Result string `json:"result"`
}

// System returns the measured system named name, or nil.
func (res *Results) System(name string) *System {
	for _, s := range res.Systems {
		if s.Spec.Name == name && s.Error == "" {
			return s
		}
	}
	return nil
}

// baseline returns the plain reverse_proxy system that s's low-load
// latency is compared with: the one with as many nodes, else the
// single node; nil when neither ran.
func (res *Results) baseline(s *System) *System {
	return res.baselineFor(s, func(s *System) *LoadRun { return s.LowLoad })
}

// baselineFor returns the plain reverse_proxy system that s's load pick
// is compared with: the one with as many nodes that ran that load, else
// the single node; nil when neither ran it.
func (res *Results) baselineFor(s *System, pick func(*System) *LoadRun) *System {
	var single *System
	for _, b := range res.Systems {
		if b.Spec.Kind != systems.KindPlain || pick(b) == nil || b == s {
			continue
		}
		if b.Spec.Nodes == s.Spec.Nodes {
			return b
		}
		if b.Spec.Nodes == 1 {
			single = b
		}
	}
	return single
}

// DefaultSettings returns the loads of a quick or a full run.
func DefaultSettings(quick bool) Settings {
	s := Settings{
		Permits: 4, ServiceMS: 10, ShortServiceMS: 2, Clients: 64, MaxWaitS: 60,
		LowLoadClients: 1, LowLoadDelayMS: 0,
		StreamTokens: 5, StreamTokenMS: 2, IdleWindowS: 5,
		WaiterRampRPS: 1000, WaiterRampMiBps: 16,
	}
	if quick {
		s.SaturatedS, s.LowLoadS, s.OpenLoopS = 3, 2, 2
		s.OpenLoopLoads = []float64{0.5, 0.8, 0.95, 1.1}
		s.Waiters = 2000
		return s
	}
	s.SaturatedS, s.LowLoadS, s.OpenLoopS = 10, 5, 5
	s.Bursts = []Burst{{PromptBytes: 1 << 10, RPS: 2000}, {PromptBytes: 64 << 10, RPS: 1000}}
	s.OpenLoopLoads = []float64{0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.1}
	s.Waiters = 10000
	s.StreamSaturated = true
	return s
}
