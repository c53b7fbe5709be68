package report

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
)

// Configs is the config scenario: the saturated load against HAProxy and
// against fair_queue configured by the bench's JSON and by an operator's
// Caddyfile (Spec.Caddyfile), every system running throughout and the
// load alternating between them, round after round, so that a drift of
// the machine (another process, a warmer cache) falls on all of them.
type Configs struct {
	// Rounds is how many times each system was loaded.
	Rounds int `json:"rounds"`
	// Systems are the systems, HAProxy first.
	Systems []*ConfigSystem `json:"systems"`
}

// ConfigSystem is one system's saturated loads, one per round.
type ConfigSystem struct {
	Spec systems.Spec `json:"spec"`
	// Error says why the system could not be measured.
	Error string `json:"error,omitempty"`
	// Runs are its loads in round order; Ratios their throughput over
	// HAProxy's in the same round.
	Runs   []*LoadRun `json:"runs"`
	Ratios []float64  `json:"ratios,omitempty"`
}

// SetRatios fills each system's throughput ratios over HAProxy, round by
// round (nil when HAProxy did not run every round).
func (cs *Configs) SetRatios() {
	ha := cs.System("haproxy")
	if ha == nil {
		return
	}
	for _, s := range cs.Systems {
		if s == ha || len(s.Runs) != len(ha.Runs) {
			continue
		}
		s.Ratios = make([]float64, len(s.Runs))
		for i, run := range s.Runs {
			if h := ha.Runs[i].Throughput; h > 0 {
				s.Ratios[i] = Round(run.Throughput/h, 3)
			}
		}
	}
}

// System returns the system named name, or nil.
func (cs *Configs) System(name string) *ConfigSystem {
	for _, s := range cs.Systems {
		if s.Spec.Name == name {
			return s
		}
	}
	return nil
}

// configChecks checks the throughput target on the median round of each
// fair_queue system of the config scenario: in the bench's config and in
// a Caddyfile.
func configChecks(cs *Configs) []Check {
	if cs == nil {
		return nil
	}
	var checks []Check
	for _, s := range cs.Systems {
		if s.Spec.Kind != systems.KindFairQueue {
			continue
		}
		c := Check{Target: TargetThroughput, System: s.Spec.Name + " (alternated)"}
		if len(s.Ratios) == 0 {
			c.Value, c.Result = "not measured: "+s.Error, "FAIL"
			checks = append(checks, c)
			continue
		}
		m := median(s.Ratios)
		c.Value = fmt.Sprintf("median %.3fx HAProxy over %d rounds (%s)", m, len(s.Ratios), ratioList(s.Ratios))
		c.Result = verdict(m >= throughputTarget(s.Spec))
		checks = append(checks, c)
	}
	return checks
}

// ratioList writes ratios as "0.951, 0.948, ...".
func ratioList(rs []float64) string { return floatList(rs, 3) }

// configsMarkdown writes the config scenario's section.
func configsMarkdown(b *strings.Builder, cs *Configs, set Settings) {
	if cs == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Config: the bench's JSON and a Caddyfile, alternated\n\n")
	w("The saturated load (%d clients, %d permits, %.0f ms upstream, %.0f s) against HAProxy and against each\n",
		set.Clients, set.Permits, set.ServiceMS, set.SaturatedS)
	w("fair_queue topology configured twice: by the bench's JSON (admin off, warnings only, `flush_interval -1`)\n")
	w("and by an operator's Caddyfile (`:port { route { fair_queue {...} reverse_proxy ... } }`, every other\n")
	w("setting at its default: admin endpoint on, INFO logs). Every system runs throughout; the load goes to\n")
	w("one at a time, the order rotating each round (%d rounds), and each ratio divides by HAProxy's throughput\n", cs.Rounds)
	w("in the same round.\n\n")
	w("| system | req/s per round | vs HAProxy per round | median vs HAProxy | handoff p50 ms (median) | proxy CPU ms / req (median) | upstream max |\n|---|---|---|---|---|---|---|\n")
	for _, s := range cs.Systems {
		if s.Error != "" && len(s.Runs) == 0 {
			w("| %s | not measured: `%s` | | | | | |\n", s.Spec.Label, OneLine(s.Error, 200))
			continue
		}
		var rps, handoff, cpu []float64
		maxUp := 0
		for _, r := range s.Runs {
			rps = append(rps, r.Throughput)
			handoff = append(handoff, r.HandoffP50)
			cpu = append(cpu, r.ProxyCPUPerRequest)
			maxUp = max(maxUp, r.UpstreamMax)
		}
		rs, med := "", ""
		if len(s.Ratios) > 0 {
			rs, med = ratioList(s.Ratios), fmt.Sprintf("%.3fx", median(s.Ratios))
		}
		w("| %s | %s | %s | %s | %.3f | %.4f | %d |\n", s.Spec.Label, floatList(rps, 1), rs, med,
			median(handoff), median(cpu), maxUp)
	}
}

// floatList writes vs with digits decimals, comma-separated.
func floatList(vs []float64, digits int) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatFloat(v, 'f', digits, 64)
	}
	return strings.Join(parts, ", ")
}
