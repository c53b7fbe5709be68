package report

// The fairness scenario's figures: shares of permit-time per tenant and
// window, its targets, and its section of the report.

import (
	"fmt"
	"image/color"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The fairness scenario: a few permits, three tenants in closed loops. The
// heavy tenants "long" and "short" have as many clients each, and a
// request of "long" holds its permit 4x longer (4x the tokens at the same
// time per token); "chat" has one client, which sends its next request
// when its answer came, as a chat user does. It runs once per queue mode
// (FairModes): strict FIFO, then fair by count, by permit-time and by
// tokens. The permit-time of each request is measured at the upstream
// (an in-process mockllm that records when each request arrived and
// ended, and for which tenant).
const (
	TenantLong  = "long"
	TenantShort = "short"
	TenantChat  = "chat"

	// HeaderTenant carries the tenant of a request; fair_queue reads it
	// with TenantPlaceholder.
	HeaderTenant      = "X-Tenant"
	TenantPlaceholder = "{http.request.header." + HeaderTenant + "}"
)

// Fairness targets, reported (a missed one is a result, not a failure).
const (
	TargetFairTime   = "cost time: long and short each 42-58% of their permit-time"
	TargetFairTokens = "cost tokens: long and short each 42-58% of their permit-time"
)

// FairMode is one queue configuration of the fairness scenario.
type FairMode struct {
	// Name is short ("fifo", "requests"...); Label how tables show it.
	Name  string `json:"name"`
	Label string `json:"label"`
	// Tenant sets fair_queue's tenant (else strict FIFO); Cost its cost
	// mode ("" for the default, requests).
	Tenant bool   `json:"tenant"`
	Cost   string `json:"cost,omitempty"`
}

// FairModes are the queue modes the fairness scenario runs, FIFO first.
func FairModes() []FairMode {
	return []FairMode{
		{Name: "fifo", Label: "strict FIFO (no tenant)"},
		{Name: "requests", Label: "cost requests", Tenant: true},
		{Name: "time", Label: "cost time", Tenant: true, Cost: "time"},
		{Name: "tokens", Label: "cost tokens", Tenant: true, Cost: "tokens"},
	}
}

// FairTenantLoad is the load of one tenant.
type FairTenantLoad struct {
	// Tenant is its name, sent as HeaderTenant.
	Tenant string `json:"tenant"`
	// Clients is its closed-loop concurrency.
	Clients int `json:"clients"`
	// Tokens is the answer's length (X-Mock-Tokens): with the settings'
	// TokenDelayUS, the upstream time of one request.
	Tokens int `json:"tokens"`
}

// FairnessSettings shape the fairness scenario.
type FairnessSettings struct {
	// Permits and Nodes configure the fair_queue (Redis store, the
	// clients' requests round-robin over the nodes).
	Permits int `json:"permits"`
	Nodes   int `json:"nodes"`
	// DurationS is how long each mode runs; WindowS the width of the
	// windows the shares are taken over, in seconds.
	DurationS float64 `json:"duration_s"`
	WindowS   float64 `json:"window_s"`
	// TokenDelayUS is the upstream's time per token (X-Mock-Delay: an
	// unstreamed answer comes after tokens x delay).
	TokenDelayUS float64 `json:"token_delay_us"`
	// Tenants are the loads, long first.
	Tenants []FairTenantLoad `json:"tenants"`
}

// ServiceMS is the upstream time of one request of l.
func (s FairnessSettings) ServiceMS(l FairTenantLoad) float64 {
	return float64(l.Tokens) * s.TokenDelayUS / 1000
}

// Fairness is what the fairness scenario measured.
type Fairness struct {
	// Settings is the scenario; System describes the queue.
	Settings FairnessSettings `json:"settings"`
	System   string           `json:"system"`
	// Runs holds one run per mode, in the order of FairModes.
	Runs []*FairRun `json:"runs"`
	// Error says why the scenario could not run at all.
	Error string `json:"error,omitempty"`
}

// FairRun is one mode of the fairness scenario.
type FairRun struct {
	// Mode is the queue mode.
	Mode FairMode `json:"mode"`
	// Tenants holds one entry per tenant, in the order of the settings.
	Tenants []*FairTenant `json:"tenants"`
	// UpstreamMax is the most requests the upstream served at once.
	UpstreamMax int `json:"upstream_max_in_flight"`
	// Error says why the mode could not be measured.
	Error string `json:"error,omitempty"`
}

// Tenant returns the entry of the tenant named name, or nil.
func (r *FairRun) Tenant(name string) *FairTenant {
	for _, t := range r.Tenants {
		if t.Tenant == name {
			return t
		}
	}
	return nil
}

// PairShare is long's share of the permit-time long and short had
// together: 0.5 when the two heavy tenants got equal use; -1 when
// neither ran.
func (r *FairRun) PairShare() float64 {
	l, s := r.Tenant(TenantLong), r.Tenant(TenantShort)
	if l == nil || s == nil || l.PermitS+s.PermitS <= 0 {
		return -1
	}
	return l.PermitS / (l.PermitS + s.PermitS)
}

// FairTenant is what one tenant got in one mode, over the run's duration
// (requests still running at its end count up to the end; the drain
// after it, when no one is backlogged any more, is left out).
type FairTenant struct {
	// Tenant is its name.
	Tenant string `json:"tenant"`
	// Requests is the requests that reached the upstream in the run;
	// Failed and Rejected count the client's failures and rejects.
	Requests int `json:"requests"`
	Failed   int `json:"failed"`
	Rejected int `json:"rejected"`
	// PermitS is the upstream time of its requests (a permit held each),
	// in seconds; PermitShare and RequestShare its share of all tenants'
	// permit-time and requests.
	PermitS      float64 `json:"permit_s"`
	PermitShare  float64 `json:"permit_share"`
	RequestShare float64 `json:"request_share"`
	// ServiceMS is the median upstream time of one of its requests.
	ServiceMS float64 `json:"service_ms"`
	// WaitP50 and WaitP99 are the time its requests spent before the
	// upstream (queued, plus the proxy), ms: exact for a one-client
	// tenant (its requests matched with their upstream spans in order),
	// else the client's total time minus ServiceMS.
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP99 float64 `json:"wait_p99_ms"`
	// Shares is its share of the permit-time in each window of the run.
	Shares []float64 `json:"shares"`
}

// fairnessChecks are the targets of the fairness scenario.
func fairnessChecks(f *Fairness) []Check {
	if f == nil {
		return nil
	}
	var checks []Check
	for _, run := range f.Runs {
		var target string
		switch run.Mode.Cost {
		case "time":
			target = TargetFairTime
		case "tokens":
			target = TargetFairTokens
		default:
			continue
		}
		name := fmt.Sprintf("%s (%s)", f.System, run.Mode.Label)
		if run.Error != "" {
			checks = append(checks, Check{Target: target, System: name, Value: "not measured: " + OneLine(run.Error, 160), Result: "FAIL"})
			continue
		}
		p := run.PairShare()
		if p < 0 {
			checks = append(checks, Check{Target: target, System: name, Value: "no permit-time measured", Result: "FAIL"})
			continue
		}
		l, s := run.Tenant(TenantLong), run.Tenant(TenantShort)
		value := fmt.Sprintf("long %.1f%%, short %.1f%% of their permit-time (%.1f / %.1f s; %.1f%% / %.1f%% of all, chat %.1f%%)",
			100*p, 100*(1-p), l.PermitS, s.PermitS, 100*l.PermitShare, 100*s.PermitShare, 100*shareOf(run, TenantChat))
		checks = append(checks, Check{Target: target, System: name, Value: value, Result: verdict(p >= 0.42 && p <= 0.58)})
	}
	return checks
}

func shareOf(run *FairRun, tenant string) float64 {
	if t := run.Tenant(tenant); t != nil {
		return t.PermitShare
	}
	return 0
}

// fairnessMarkdown writes the Fairness section of BENCHMARKS.md; plot is
// the link to its plot, empty when none was drawn.
func fairnessMarkdown(b *strings.Builder, f *Fairness, plot string) {
	if f == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	set := f.Settings
	w("\n## Fairness\n\n")
	w("%s, closed loops for %.0f s per mode, unstreamed answers of %.0f us per token, the tenant\n", f.System, set.DurationS, set.TokenDelayUS)
	w("in the `%s` header (`tenant %s`; without it the queue is strict FIFO). Tenants:\n", HeaderTenant, TenantPlaceholder)
	for i, l := range set.Tenants {
		sep := ","
		if i == len(set.Tenants)-1 {
			sep = "."
		}
		plural := "s"
		if l.Clients == 1 {
			plural = ""
		}
		w("**%s** %d client%s x %d tokens (%.0f ms)%s", l.Tenant, l.Clients, plural, l.Tokens, set.ServiceMS(l), sep)
		if i < len(set.Tenants)-1 {
			w(" ")
		}
	}
	w("\nPermit-time: the time each request spent at the upstream (an in-process mockllm that records each request's\n")
	w("arrival and end), up to the end of the run (the drain after it, when no one is backlogged, is left out).\n")
	w("Wait: before the upstream; exact for chat (one client: its requests matched with their upstream spans), for the\n")
	w("others the client's total time minus the tenant's median upstream time. With fair use all three tenants are\n")
	w("backlogged or running all the time: equal permit-time is 1/3 each, though chat, one request at a time on %d\n", set.Permits)
	w("permits, can only take a permit when one frees after each of its answers.\n")
	if f.Error != "" {
		w("\nNot measured: `%s`\n", OneLine(f.Error, 300))
		return
	}
	for _, run := range f.Runs {
		w("\n**%s**", run.Mode.Label)
		if run.Error != "" {
			w(": not measured: `%s`\n", OneLine(run.Error, 300))
			continue
		}
		if p := run.PairShare(); p >= 0 {
			w(" (long %.1f%% / short %.1f%% of their permit-time; upstream max %d of %d permits)", 100*p, 100*(1-p), run.UpstreamMax, set.Permits)
		}
		w("\n\n| tenant | clients | permit-time s | share of permit-time | requests | share of requests | upstream ms / req | wait p50 ms | wait p99 ms | rejected / failed |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for i, t := range run.Tenants {
			clients := 0
			if i < len(set.Tenants) {
				clients = set.Tenants[i].Clients
			}
			w("| %s | %d | %.2f | %.1f%% | %d | %.1f%% | %.1f | %.1f | %.1f | %d / %d |\n", t.Tenant, clients, t.PermitS, 100*t.PermitShare,
				t.Requests, 100*t.RequestShare, t.ServiceMS, t.WaitP50, t.WaitP99, t.Rejected, t.Failed)
		}
	}
	w("\n%s\n", fairnessSummary(f))
	if plot != "" {
		w("\n%s\n", plotNote("Share of permit-time per tenant over time, per mode", plot))
	}
}

// fairnessSummary says in one sentence what the runs show.
func fairnessSummary(f *Fairness) string {
	long := map[string]float64{}
	chat := map[string]float64{}
	for _, run := range f.Runs {
		if run.Error == "" {
			long[run.Mode.Name] = shareOf(run, TenantLong)
			chat[run.Mode.Name] = shareOf(run, TenantChat)
		}
	}
	pct := func(m map[string]float64, k string) string {
		v, ok := m[k]
		if !ok {
			return "(not run)"
		}
		return fmt.Sprintf("%.0f%%", 100*v)
	}
	return fmt.Sprintf("In short: strict FIFO hands out permits by client, so long (4x the permit-time per request) takes %s of the "+
		"permit-time and chat %s; `cost requests` equalizes the grants per tenant, not the use (long %s, chat %s); "+
		"`cost time` and `cost tokens` charge what each request used, bringing long down to %s and %s, while chat gets %s and %s (at most 50%% with one request at a time on 2 permits).",
		pct(long, "fifo"), pct(chat, "fifo"), pct(long, "requests"), pct(chat, "requests"),
		pct(long, "time"), pct(long, "tokens"), pct(chat, "time"), pct(chat, "tokens"))
}

// PlotFairness is the file of the fairness plot, in the output directory.
const PlotFairness = "fairness-permit-time-share.png"

// writeFairnessPlot draws, one panel per mode, each tenant's share of the
// permit-time per window over the run; it reports whether it wrote the
// file (not when no mode was measured).
func writeFairnessPlot(f *Fairness, path string) (bool, error) {
	if f == nil {
		return false, nil
	}
	var panels []*plot.Plot
	set := f.Settings
	for _, run := range f.Runs {
		if run.Error != "" || len(run.Tenants) == 0 {
			continue
		}
		p := plot.New()
		p.Title.Text = run.Mode.Label + " (dashed: equal share)"
		p.X.Label.Text = fmt.Sprintf("time (s, %g s windows)", set.WindowS)
		p.Y.Label.Text = "share of permit-time"
		p.Y.Min, p.Y.Max = 0, 1.2 // the legend above 1
		p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 0, Label: "0"}, {Value: 0.25}, {Value: 0.5, Label: "0.5"},
			{Value: 0.75}, {Value: 1, Label: "1"}})
		p.X.Min, p.X.Max = 0, set.DurationS
		p.Legend.Top, p.Legend.Left = true, false
		p.Add(plotter.NewGrid())
		equal := plotter.XYs{{X: 0, Y: 1.0 / float64(len(run.Tenants))}, {X: set.DurationS, Y: 1.0 / float64(len(run.Tenants))}}
		l, err := plotter.NewLine(equal)
		if err != nil {
			return false, err
		}
		l.Color = color.Gray{Y: 120}
		l.Dashes = plotutil.Dashes(2)
		p.Add(l)
		for i, t := range run.Tenants {
			xys := make(plotter.XYs, len(t.Shares))
			for w, v := range t.Shares {
				xys[w] = plotter.XY{X: (float64(w) + 0.5) * set.WindowS, Y: v}
			}
			if len(xys) == 1 {
				xys = append(xys, plotter.XY{X: xys[0].X + set.WindowS/2, Y: xys[0].Y})
			}
			if err := addLine(p, i, t.Tenant, xys); err != nil {
				return false, err
			}
		}
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return false, nil
	}
	cols := min(2, len(panels))
	rows := (len(panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for r := range grid {
		grid[r] = make([]*plot.Plot, cols)
		for c := range cols {
			if i := r*cols + c; i < len(panels) {
				grid[r][c] = panels[i]
			}
		}
	}
	width, height := vg.Length(cols)*13*vg.Centimeter, vg.Length(rows)*9*vg.Centimeter
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: 6 * vg.Millimeter, PadY: 6 * vg.Millimeter,
		PadTop: 3 * vg.Millimeter, PadBottom: 3 * vg.Millimeter, PadLeft: 3 * vg.Millimeter, PadRight: 3 * vg.Millimeter}
	canvases := plot.Align(grid, tiles, dc)
	for r := range grid {
		for c, p := range grid[r] {
			if p != nil {
				p.Draw(canvases[r][c])
			}
		}
	}
	file, err := os.Create(path)
	if err != nil {
		return false, err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(file); err != nil {
		file.Close()
		return false, err
	}
	return true, file.Close()
}

// DefaultFairnessSettings returns the scenario of a quick or a full run.
func DefaultFairnessSettings(quick bool) FairnessSettings {
	s := FairnessSettings{
		Permits: 2, Nodes: 2, DurationS: 15, WindowS: 1, TokenDelayUS: 100,
		Tenants: []FairTenantLoad{
			{Tenant: TenantLong, Clients: 4, Tokens: 800},
			{Tenant: TenantShort, Clients: 4, Tokens: 200},
			{Tenant: TenantChat, Clients: 1, Tokens: 200},
		},
	}
	if quick {
		s.DurationS, s.WindowS = 4, 0.5
	}
	return s
}
