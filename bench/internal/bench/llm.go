package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// The LLM-shaped scenario: an open loop of Poisson arrivals at fractions
// of the capacity of a few permits (an LLM replica's sequences), each
// request streamed for a service time drawn from a log-normal (median
// 1 s, p99 10 s) at 20 ms per token, with a prompt of 1-32 KiB. Every
// system gets the same drawn sequence at each load (one fixed seed per
// load), so they see identical arrivals, sizes and service times; each
// point runs until every request sent is answered (the drain, bounded),
// so the next starts with an empty queue.

// LLM-shaped targets, reported (a missed one is a result, not a failure).
const (
	TargetLLMUtil = "LLM-shaped load: utilization >= 0.99x HAProxy's"
	TargetLLMWait = "LLM-shaped load: wait p99 <= 1.1x HAProxy's"
)

// LLMSettings shape the LLM-shaped scenario.
type LLMSettings struct {
	// Permits is the permits of every system (HAProxy maxconn too).
	Permits int `json:"permits"`
	// Loads are the arrival rates as fractions of the capacity, Permits /
	// the sample mean service time of the drawn sequence (each load's
	// sequence offers load x Permits x ArrivalsS of work: loadgen.NewPlan).
	Loads []float64 `json:"loads"`
	// ArrivalsS is how long each point sends arrivals; DrainMaxS bounds
	// the wait after it for the requests still queued or running (those
	// left then are canceled).
	ArrivalsS float64 `json:"arrivals_s"`
	DrainMaxS float64 `json:"drain_max_s"`
	// MaxWaitS is fair_queue's max_wait and HAProxy's timeout queue: long
	// enough that nothing should be rejected at the highest load.
	MaxWaitS float64 `json:"max_wait_s"`
	// Seed is the base of each load's seed (LevelSeed).
	Seed uint64 `json:"seed"`
	// Shape is the requests' distribution.
	MedianMS       float64 `json:"service_median_ms"`
	P99MS          float64 `json:"service_p99_ms"`
	MaxServiceMS   float64 `json:"service_max_ms"`
	TokenMS        float64 `json:"token_ms"`
	MinPromptBytes int     `json:"min_prompt_bytes"`
	MaxPromptBytes int     `json:"max_prompt_bytes"`
}

// llmSettings returns the scenario of a quick or a full run.
func llmSettings(quick bool) LLMSettings {
	sh := loadgen.DefaultLLMShape
	s := LLMSettings{
		Permits: 8, Loads: []float64{0.7, 0.9, 1.0, 1.1}, ArrivalsS: 40, DrainMaxS: 180,
		MaxWaitS: 300, Seed: 16_000,
		MedianMS: msOf(sh.Median), P99MS: msOf(sh.P99), MaxServiceMS: msOf(sh.MaxService),
		TokenMS: msOf(sh.TokenTime), MinPromptBytes: sh.MinPrompt, MaxPromptBytes: sh.MaxPrompt,
	}
	if quick {
		s.Loads, s.ArrivalsS, s.DrainMaxS = []float64{1.0}, 8, 90
	}
	return s
}

// Shape is the loadgen shape of the settings.
func (s LLMSettings) Shape() loadgen.LLMShape {
	return loadgen.LLMShape{
		Median: ms2d(s.MedianMS), P99: ms2d(s.P99MS), MaxService: ms2d(s.MaxServiceMS),
		TokenTime: ms2d(s.TokenMS), MinPrompt: s.MinPromptBytes, MaxPrompt: s.MaxPromptBytes,
	}
}

// LevelSeed is the seed of the sequence at load: fixed per load, the same
// for every system (and for a quick and a full run).
func (s LLMSettings) LevelSeed(load float64) uint64 {
	return s.Seed + uint64(math.Round(load*1000))
}

// Plan draws the sequence of one load.
func (s LLMSettings) Plan(load float64) loadgen.Plan {
	return loadgen.NewPlan(s.Shape(), s.LevelSeed(load), s.Permits, load, secs(s.ArrivalsS))
}

// LLM is what the LLM-shaped scenario measured.
type LLM struct {
	// Settings is the scenario; Levels describes the sequence of each
	// load, in the order of Settings.Loads.
	Settings LLMSettings `json:"settings"`
	Levels   []*LLMLevel `json:"levels"`
	// Systems holds one entry per system, HAProxy first.
	Systems []*LLMSystem `json:"systems"`
}

// LLMLevel is the drawn sequence of one load.
type LLMLevel struct {
	Load float64 `json:"load"`
	Seed uint64  `json:"seed"`
	// Rate is the arrival rate (req/s), Arrivals the requests drawn.
	Rate     float64 `json:"rate_rps"`
	Arrivals int     `json:"arrivals"`
	// MeanServiceMS is their mean service time (tokens x token time);
	// ModelMeanServiceMS the log-normal's; WorkS their services summed.
	MeanServiceMS      float64 `json:"mean_service_ms"`
	ModelMeanServiceMS float64 `json:"model_mean_service_ms"`
	WorkS              float64 `json:"work_s"`
	// Offered is WorkS / (permits x arrivals' duration): the load the
	// sequence offers (Load, up to the request at the boundary).
	Offered float64 `json:"offered_load"`
	// MaxServiceMS is the longest service drawn; LastArrivalS when the
	// last request is sent.
	MaxServiceMS float64 `json:"max_service_ms"`
	LastArrivalS float64 `json:"last_arrival_s"`
}

// LLMSystem is one system under the LLM-shaped load.
type LLMSystem struct {
	Spec systems.Spec `json:"spec"`
	// Error says why it could not be measured at all.
	Error string `json:"error,omitempty"`
	// Points holds one point per load, in the order of Settings.Loads.
	Points []*LLMPoint `json:"points"`
}

// point returns the point at load, or nil.
func (s *LLMSystem) point(load float64) *LLMPoint {
	for _, p := range s.Points {
		if p.Load == load && p.Error == "" {
			return p
		}
	}
	return nil
}

// LLMPoint is one system at one load.
type LLMPoint struct {
	Load float64 `json:"load"`
	// Sent, OK (served), Rejected, Failed and Canceled (cut at the drain
	// bound) count requests by outcome; Reasons the rejects by reason.
	Sent     int            `json:"sent"`
	OK       int            `json:"ok"`
	Rejected int            `json:"rejected"`
	Failed   int            `json:"failed"`
	Canceled int            `json:"canceled"`
	Reasons  map[string]int `json:"reasons,omitempty"`
	// ElapsedS is the wall time from the first arrival to the last
	// answer; DrainS the part after the last arrival.
	ElapsedS float64 `json:"elapsed_s"`
	DrainS   float64 `json:"drain_s"`
	// BusyS is the permit-time the upstream was busy (mockllm -timeline);
	// Utilization BusyS / (permits x ElapsedS), as the saturated load's.
	BusyS       float64 `json:"busy_s"`
	Utilization float64 `json:"permit_utilization"`
	// UpstreamMax is the upstream's highest concurrency; UpstreamServed
	// the completions it answered in full.
	UpstreamMax    int `json:"upstream_max_in_flight"`
	UpstreamServed int `json:"upstream_served"`
	// Wait* are the time to first byte of the served requests, ms: the
	// wait for a permit plus the proxy's latency (mockllm sends its
	// headers at once).
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP90 float64 `json:"wait_p90_ms"`
	WaitP99 float64 `json:"wait_p99_ms"`
	WaitMax float64 `json:"wait_max_ms"`
	// Error says why the point could not be measured.
	Error string `json:"error,omitempty"`
}

// llmSpecs are the systems of the scenario: HAProxy, then fair_queue
// local, Redis 1 node and Redis 3 nodes.
func llmSpecs() []systems.Spec {
	var out []systems.Spec
	for _, s := range systems.DefaultSpecs() {
		if s.Kind == systems.KindHAProxy || (s.Kind == systems.KindFairQueue && !s.BaselineOnly) {
			out = append(out, s)
		}
	}
	return out
}

// runLLM runs the LLM-shaped scenario on every system of llmSpecs, each
// with the scenario's permits and max_wait.
func (b *bench) runLLM(ctx context.Context) {
	set := llmSettings(b.opts.Quick)
	l := &LLM{Settings: set}
	b.res.LLM = l
	plans := make([]loadgen.Plan, len(set.Loads))
	for i, load := range set.Loads {
		plans[i] = set.Plan(load)
		l.Levels = append(l.Levels, levelOf(set, plans[i]))
	}
	b.logf("== LLM-shaped load: %d permits, log-normal service (median %.0f ms, p99 %.0f ms) at %.0f ms per token, %.0f s of Poisson arrivals per load",
		set.Permits, set.MedianMS, set.P99MS, set.TokenMS, set.ArrivalsS)
	for _, lv := range l.Levels {
		b.logf("   load %.2f: %d arrivals at %.2f/s, mean service %.0f ms (model %.0f), longest %.0f ms, work %.0f permit-s (offered load %.3f)",
			lv.Load, lv.Arrivals, lv.Rate, lv.MeanServiceMS, lv.ModelMeanServiceMS, lv.MaxServiceMS, lv.WorkS, lv.Offered)
	}
	env := *b.env
	env.Permits, env.MaxWait = set.Permits, secs(set.MaxWaitS)
	for _, spec := range llmSpecs() {
		if ctx.Err() != nil {
			return
		}
		l.Systems = append(l.Systems, b.llmSystem(ctx, &env, spec, set, plans))
	}
}

// levelOf describes plan.
func levelOf(set LLMSettings, p loadgen.Plan) *LLMLevel {
	lv := &LLMLevel{
		Load: p.Load, Seed: set.LevelSeed(p.Load), Rate: round(p.Rate, 3), Arrivals: len(p.Arrivals),
		MeanServiceMS: msOf(p.MeanService), ModelMeanServiceMS: msOf(p.MeanServiceModel), WorkS: round(p.Work.Seconds(), 1),
	}
	if p.Duration > 0 && p.Permits > 0 {
		lv.Offered = round(p.Work.Seconds()/(float64(p.Permits)*p.Duration.Seconds()), 3)
	}
	for _, a := range p.Arrivals {
		lv.MaxServiceMS = max(lv.MaxServiceMS, msOf(time.Duration(a.Tokens)*a.Delay))
	}
	if n := len(p.Arrivals); n > 0 {
		lv.LastArrivalS = round(p.Arrivals[n-1].At.Seconds(), 3)
	}
	return lv
}

// llmSystem starts spec (under a name of its own: its logs and its
// queue are not the other scenarios'), runs every load on it and stops
// it.
func (b *bench) llmSystem(ctx context.Context, env *systems.Env, spec systems.Spec, set LLMSettings, plans []loadgen.Plan) *LLMSystem {
	sys := &LLMSystem{Spec: spec}
	b.logf("== LLM-shaped load: %s", spec.Label)
	run := spec
	run.Name = "llm-" + spec.Name
	r, err := env.Start(ctx, run)
	if err != nil {
		sys.Error = err.Error()
		b.logf("   not measured: %v", oneLine(err.Error(), 300))
		return sys
	}
	defer env.Stop(r)
	if err := b.warm(ctx, r); err != nil {
		sys.Error = err.Error()
		return sys
	}
	for _, plan := range plans {
		if ctx.Err() != nil {
			return sys
		}
		p := b.llmPoint(ctx, r, set, plan)
		sys.Points = append(sys.Points, p)
		if p.Error != "" {
			b.logf("   load %.2f failed: %s", plan.Load, oneLine(p.Error, 300))
			continue
		}
		b.logf("   load %.2f  %4d sent  ok %4d rejected %d failed %d canceled %d  wait p50 %8.1f ms  p99 %8.1f ms  utilization %.3f  upstream max %d  %.1f s (drain %.1f s)",
			p.Load, p.Sent, p.OK, p.Rejected, p.Failed, p.Canceled, p.WaitP50, p.WaitP99, p.Utilization, p.UpstreamMax, p.ElapsedS, p.DrainS)
	}
	return sys
}

// llmPoint runs one load on r: it waits for the upstream to be idle,
// resets the counters, sends the plan's arrivals and waits for their
// answers (up to the drain bound).
func (b *bench) llmPoint(ctx context.Context, r *systems.Running, set LLMSettings, plan loadgen.Plan) *LLMPoint {
	p := &LLMPoint{Load: plan.Load}
	fail := func(err error) *LLMPoint {
		p.Error = err.Error()
		return p
	}
	if err := b.waitUpstreamIdle(ctx, 30*time.Second); err != nil {
		return fail(err)
	}
	if err := b.resetCounters(ctx); err != nil {
		return fail(err)
	}
	lctx, cancel := context.WithTimeout(ctx, secs(set.ArrivalsS+set.DrainMaxS))
	defer cancel()
	rep, err := b.load(lctx, r.Targets, loadgen.Config{
		Schedule: plan.Arrivals, Stream: true, Tokens: -1, Delay: -1,
		Timeout: secs(set.MaxWaitS+set.MaxServiceMS/1000) + 30*time.Second,
	})
	if err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	time.Sleep(200 * time.Millisecond) // the last releases
	st, err := b.mockStats(ctx)
	if err != nil {
		return fail(err)
	}
	p.Sent, p.OK, p.Rejected, p.Failed, p.Canceled = rep.Sent, rep.OK, rep.Rejected, rep.Failed, rep.Canceled
	if len(rep.ByReason) > 0 {
		p.Reasons = rep.ByReason
	}
	p.ElapsedS = round(rep.Elapsed, 3)
	if n := len(plan.Arrivals); n > 0 {
		p.DrainS = round(rep.Elapsed-plan.Arrivals[n-1].At.Seconds(), 3)
	}
	p.BusyS = round(st.BusyMS/1000, 3)
	p.Utilization = utilization(st.BusyMS, set.Permits, rep.Elapsed)
	p.UpstreamMax, p.UpstreamServed = st.MaxInFlight, st.Served
	w := rep.Overall.TTFB
	p.WaitP50, p.WaitP90, p.WaitP99, p.WaitMax = w.P50, w.P90, w.P99, w.Max
	return p
}

// utilization is busy permit-time (ms) / (permits x wall time (s)),
// rounded to 3 digits; 0 without a wall time.
func utilization(busyMS float64, permits int, elapsedS float64) float64 {
	if permits <= 0 || elapsedS <= 0 {
		return 0
	}
	return round(busyMS/(float64(permits)*elapsedS*1000), 3)
}

// waitUpstreamIdle waits until mockllm runs no completion (the previous
// point's drained), at most limit.
func (b *bench) waitUpstreamIdle(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := b.mockStats(ctx)
		if err != nil {
			return err
		}
		if st.InFlight == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("upstream still runs %d completions after %s", st.InFlight, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
