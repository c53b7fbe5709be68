package report

// The LLM-shaped scenario's figures: its targets, its section of the
// report and its plots.

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

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

// Shape is the loadgen shape of the settings.
func (s LLMSettings) Shape() loadgen.LLMShape {
	return loadgen.LLMShape{
		Median: MS(s.MedianMS), P99: MS(s.P99MS), MaxService: MS(s.MaxServiceMS),
		TokenTime: MS(s.TokenMS), MinPrompt: s.MinPromptBytes, MaxPrompt: s.MaxPromptBytes,
	}
}

// LevelSeed is the seed of the sequence at load: fixed per load, the same
// for every system (and for a quick and a full run).
func (s LLMSettings) LevelSeed(load float64) uint64 {
	return s.Seed + uint64(math.Round(load*1000))
}

// Plan draws the sequence of one load.
func (s LLMSettings) Plan(load float64) loadgen.Plan {
	return loadgen.NewPlan(s.Shape(), s.LevelSeed(load), s.Permits, load, Secs(s.ArrivalsS))
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

// Point returns the point at load, or nil.
func (s *LLMSystem) Point(load float64) *LLMPoint {
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

// Plot files of the LLM-shaped scenario, in the output directory.
const (
	PlotLLMWait = "llm-wait-vs-load.png"
	PlotLLMUtil = "llm-utilization-vs-load.png"
)

// haproxy returns the HAProxy system of the scenario, or nil.
func (l *LLM) haproxy() *LLMSystem {
	for _, s := range l.Systems {
		if s.Spec.Kind == systems.KindHAProxy && s.Error == "" {
			return s
		}
	}
	return nil
}

// llmRatios returns the utilization and wait p99 of p over HAProxy's at
// the same load; ok is false without a HAProxy point (or a zero one).
func llmRatios(l *LLM, p *LLMPoint) (util, wait float64, ok bool) {
	ha := l.haproxy()
	if ha == nil {
		return 0, 0, false
	}
	h := ha.Point(p.Load)
	if h == nil || h.Utilization <= 0 || h.WaitP99 <= 0 {
		return 0, 0, false
	}
	return p.Utilization / h.Utilization, p.WaitP99 / h.WaitP99, true
}

// llmChecks are the targets of the scenario, per fair_queue system and
// load, and the upstream concurrency of every system and load.
func llmChecks(l *LLM) []Check {
	if l == nil {
		return nil
	}
	var checks []Check
	add := func(target, system, value, result string) {
		checks = append(checks, Check{Target: target, System: system, Value: value, Result: result})
	}
	ha := l.haproxy()
	for _, s := range l.Systems {
		for _, p := range s.Points {
			name := fmt.Sprintf("%s (LLM load %.2f)", s.Spec.Name, p.Load)
			if p.Error != "" {
				if s.Spec.Kind == systems.KindFairQueue {
					add(TargetLLMUtil, name, "not measured: "+OneLine(p.Error, 160), "FAIL")
				}
				continue
			}
			add(TargetConcurrency, name, fmt.Sprintf("%d vs %d", p.UpstreamMax, l.Settings.Permits),
				verdict(p.UpstreamMax <= l.Settings.Permits))
			if s.Spec.Kind != systems.KindFairQueue {
				continue
			}
			extra := ""
			if p.Rejected+p.Failed+p.Canceled > 0 {
				extra = fmt.Sprintf("; rejected %d, failed %d, canceled %d", p.Rejected, p.Failed, p.Canceled)
			}
			ur, wr, ok := llmRatios(l, p)
			if !ok {
				add(TargetLLMUtil, name, fmt.Sprintf("%.3f (no HAProxy run)%s", p.Utilization, extra), "n/a")
				add(TargetLLMWait, name, fmt.Sprintf("%.0f ms (no HAProxy run)%s", p.WaitP99, extra), "n/a")
				continue
			}
			h := ha.Point(p.Load)
			add(TargetLLMUtil, name, fmt.Sprintf("%.3f vs %.3f = %.3fx (%.1f vs %.1f s to serve the same work)%s",
				p.Utilization, h.Utilization, ur, p.ElapsedS, h.ElapsedS, extra), verdict(Round(ur, 3) >= 0.99))
			add(TargetLLMWait, name, fmt.Sprintf("%.0f vs %.0f ms = %.3fx (p50 %.0f vs %.0f ms)%s",
				p.WaitP99, h.WaitP99, wr, p.WaitP50, h.WaitP50, extra), verdict(Round(wr, 3) <= 1.1))
		}
	}
	return checks
}

// llmMarkdown writes the LLM-shaped section of BENCHMARKS.md; plots are
// the links to its plots, those drawn.
func llmMarkdown(b *strings.Builder, l *LLM, plots []string) {
	if l == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	set := l.Settings
	w("\n## LLM-shaped load\n\n")
	w("%d permits (an LLM replica's sequences; HAProxy `maxconn %d`), `max_wait` / `timeout queue` %.0f s. Each request\n", set.Permits, set.Permits, set.MaxWaitS)
	w("streams for a service time drawn from a log-normal (median %.0f ms, p99 %.0f ms: mu = ln(median),\n", set.MedianMS, set.P99MS)
	w("sigma = ln(p99/median)/2.326; capped at %.0f s) at %.0f ms per token (`X-Mock-Tokens` = max(1, round(service / %.0f ms))),\n",
		set.MaxServiceMS/1000, set.TokenMS, set.TokenMS)
	w("with a prompt of %d-%d bytes (uniform). Poisson arrivals for %.0f s at each load, a fraction of the capacity\n",
		set.MinPromptBytes, set.MaxPromptBytes, set.ArrivalsS)
	w("%d permits / the sample mean service time of the drawn sequence: the requests drawn until their services sum\n", set.Permits)
	w("to load x permits x %.0f s, their arrivals a Poisson process conditioned on that count (exponential gaps scaled\n", set.ArrivalsS)
	w("to end at %.0f s; left free, the count alone would move the offered load by ~7%%). Every system gets the same sequence at a\n", set.ArrivalsS)
	w("load (seed %d + 1000 x load): the same arrival times, prompts and service times. A point lasts until every\n", set.Seed)
	w("request sent is answered (at most %.0f s after the last arrival), so the next starts with an empty queue.\n", set.DrainMaxS)
	w("Utilization: the upstream's busy permit-time / (permits x the point's wall time, first arrival to last answer),\n")
	w("as the saturated load's: with the same work, a lower one means the permits idled while requests waited. Wait:\n")
	w("time to first byte of the served requests (mockllm sends its headers at once): the queueing plus the proxy.\n\n")
	w("| load | seed | arrivals | rate req/s | mean service ms (model) | longest ms | work permit-s | offered load | last arrival s |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, lv := range l.Levels {
		w("| %.2f | %d | %d | %.3f | %.0f (%.0f) | %.0f | %.1f | %.3f | %.1f |\n", lv.Load, lv.Seed, lv.Arrivals, lv.Rate,
			lv.MeanServiceMS, lv.ModelMeanServiceMS, lv.MaxServiceMS, lv.WorkS, lv.Offered, lv.LastArrivalS)
	}
	w("\n| system | load | served | rejected | failed | canceled | utilization | vs HAProxy | wait p50 ms | wait p99 ms | wait p99 vs HAProxy | wait max ms | upstream max | wall s (drain) |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range l.Systems {
		if s.Error != "" {
			w("| %s | | not measured: `%s` | | | | | | | | | | | |\n", s.Spec.Label, OneLine(s.Error, 160))
			continue
		}
		for _, p := range s.Points {
			if p.Error != "" {
				w("| %s | %.2f | not measured: `%s` | | | | | | | | | | | |\n", s.Spec.Label, p.Load, OneLine(p.Error, 160))
				continue
			}
			ur, wr := "", ""
			if u, q, ok := llmRatios(l, p); ok && s.Spec.Kind != systems.KindHAProxy {
				ur, wr = fmt.Sprintf("%.3fx", u), fmt.Sprintf("%.3fx", q)
			}
			w("| %s | %.2f | %d | %d | %d | %d | %.3f | %s | %.1f | %.1f | %s | %.1f | %d / %d | %.1f (%.1f) |\n",
				s.Spec.Label, p.Load, p.OK, p.Rejected, p.Failed, p.Canceled, p.Utilization, ur, p.WaitP50, p.WaitP99, wr,
				p.WaitMax, p.UpstreamMax, set.Permits, p.ElapsedS, p.DrainS)
		}
	}
	w("\nWith about %d requests per point, a p99 is the second or third longest wait: compare runs, not single figures.\n",
		arrivalsTypical(l))
	for _, p := range plots {
		alt := "Wait p50 and p99 vs load, per system"
		if strings.HasSuffix(p, PlotLLMUtil) {
			alt = "Permit utilization vs load, per system"
		}
		w("\n%s\n", plotNote(alt, p))
	}
}

// arrivalsTypical is the median number of arrivals of the levels.
func arrivalsTypical(l *LLM) int {
	if len(l.Levels) == 0 {
		return 0
	}
	return l.Levels[len(l.Levels)/2].Arrivals
}

// writeLLMPlots draws the wait p50 / p99 and the utilization against the
// load, one line per system, and returns the files written.
func writeLLMPlots(l *LLM, dir string) ([]string, error) {
	if l == nil {
		return nil, nil
	}
	var written []string
	set := l.Settings
	draw := func(file, title, ylabel string, value func(*LLMPoint) float64, dashed func(*LLMPoint) float64) error {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = fmt.Sprintf("load (arrival rate / capacity of %d permits)", set.Permits)
		p.Y.Label.Text = ylabel
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		if len(set.Loads) > 0 {
			p.X.Min, p.X.Max = slices.Min(set.Loads)-0.05, slices.Max(set.Loads)+0.05
		}
		p.Y.Min = 0
		hi := 0.0
		n := 0
		for i, s := range l.Systems {
			var xys, xys2 plotter.XYs
			for _, pt := range s.Points {
				if pt.Error == "" {
					xys = append(xys, plotter.XY{X: pt.Load, Y: value(pt)})
					hi = max(hi, value(pt))
					if dashed != nil {
						xys2 = append(xys2, plotter.XY{X: pt.Load, Y: dashed(pt)})
					}
				}
			}
			if len(xys) == 0 {
				continue
			}
			if err := addLine(p, i, s.Spec.Label, xys); err != nil {
				return err
			}
			if sc, err := plotter.NewScatter(xys); err == nil {
				sc.Color = plotutil.Color(i)
				p.Add(sc)
			}
			if dashed != nil {
				dl, err := plotter.NewLine(xys2)
				if err != nil {
					return err
				}
				dl.Color = plotutil.Color(i)
				dl.Dashes = plotutil.Dashes(2)
				p.Add(dl)
				if sc, err := plotter.NewScatter(xys2); err == nil {
					sc.Color = plotutil.Color(i)
					sc.Shape = plotutil.Shape(1)
					p.Add(sc)
				}
			}
			n++
		}
		if n == 0 {
			return nil
		}
		p.Y.Max = 1.35 * hi // room for the legend above the lines
		if err := p.Save(18*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, file)); err != nil {
			return err
		}
		written = append(written, file)
		return nil
	}
	if err := draw(PlotLLMWait, fmt.Sprintf("LLM-shaped load: wait for a permit vs load (%d permits)", set.Permits),
		"wait (time to first byte, s): solid p99, dashed p50",
		func(p *LLMPoint) float64 { return p.WaitP99 / 1000 }, func(p *LLMPoint) float64 { return p.WaitP50 / 1000 }); err != nil {
		return written, err
	}
	if err := draw(PlotLLMUtil, fmt.Sprintf("LLM-shaped load: permit utilization vs load (%d permits)", set.Permits),
		"busy permit-time / (permits x wall time)",
		func(p *LLMPoint) float64 { return p.Utilization }, nil); err != nil {
		return written, err
	}
	return written, nil
}

// DefaultLLMSettings returns the scenario of a quick or a full run.
func DefaultLLMSettings(quick bool) LLMSettings {
	sh := loadgen.DefaultLLMShape
	s := LLMSettings{
		Permits: 8, Loads: []float64{0.7, 0.9, 1.0, 1.1}, ArrivalsS: 40, DrainMaxS: 180,
		MaxWaitS: 300, Seed: 16_000,
		MedianMS: MSOf(sh.Median), P99MS: MSOf(sh.P99), MaxServiceMS: MSOf(sh.MaxService),
		TokenMS: MSOf(sh.TokenTime), MinPromptBytes: sh.MinPrompt, MaxPromptBytes: sh.MaxPrompt,
	}
	if quick {
		s.Loads, s.ArrivalsS, s.DrainMaxS = []float64{1.0}, 8, 90
	}
	return s
}
