package bench

// The fairness scenario's figures: shares of permit-time per tenant and
// window, its targets, and its section of the report.

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// clientRun is what one tenant's clients saw: when their load started,
// and each request's result (its Start is since then).
type clientRun struct {
	started time.Time
	results []loadgen.Result
}

// fairShares measures each tenant's permit-time, requests and waits from
// the upstream spans and what the clients saw (clients[i] is the load of
// set.Tenants[i]), over [t0, t0 + duration], in windows of set.WindowS.
func fairShares(set FairnessSettings, spans []span, clients []clientRun, t0 time.Time) []*FairTenant {
	end := t0.Add(secs(set.DurationS))
	window := secs(set.WindowS)
	nw := max(1, int((secs(set.DurationS)+window-1)/window))
	perWindow := make([][]float64, len(set.Tenants)) // seconds, per tenant and window
	out := make([]*FairTenant, len(set.Tenants))
	index := map[string]int{}
	for i, l := range set.Tenants {
		out[i] = &FairTenant{Tenant: l.Tenant, Shares: make([]float64, nw)}
		perWindow[i] = make([]float64, nw)
		index[l.Tenant] = i
	}
	byTenant := make([][]span, len(set.Tenants))
	var totalS float64
	totalReq := 0
	for _, sp := range spans {
		i, ok := index[sp.tenant]
		if !ok {
			continue
		}
		byTenant[i] = append(byTenant[i], sp)
		if !sp.start.Before(t0) && sp.start.Before(end) {
			out[i].Requests++
			totalReq++
		}
		for w := range nw {
			ws := t0.Add(time.Duration(w) * window)
			we := ws.Add(window)
			if we.After(end) {
				we = end
			}
			if d := overlap(sp.start, sp.end, ws, we); d > 0 {
				perWindow[i][w] += d.Seconds()
				out[i].PermitS += d.Seconds()
				totalS += d.Seconds()
			}
		}
	}
	for w := range nw {
		var sum float64
		for i := range out {
			sum += perWindow[i][w]
		}
		for i := range out {
			if sum > 0 {
				out[i].Shares[w] = round(perWindow[i][w]/sum, 4)
			}
		}
	}
	for i, t := range out {
		if totalS > 0 {
			t.PermitShare = round(t.PermitS/totalS, 4)
		}
		if totalReq > 0 {
			t.RequestShare = round(float64(t.Requests)/float64(totalReq), 4)
		}
		t.PermitS = round(t.PermitS, 3)
		sps := byTenant[i]
		slices.SortFunc(sps, func(a, b span) int { return a.start.Compare(b.start) })
		service := make([]time.Duration, len(sps))
		for j, sp := range sps {
			service[j] = sp.end.Sub(sp.start)
		}
		slices.Sort(service)
		median := loadgen.Percentile(service, 50)
		t.ServiceMS = msOf(median)
		if i >= len(clients) {
			continue
		}
		cr := clients[i]
		var ok []loadgen.Result
		for _, res := range cr.results {
			switch res.Outcome {
			case loadgen.OutcomeOK:
				ok = append(ok, res)
			case loadgen.OutcomeRejected:
				t.Rejected++
			case loadgen.OutcomeFailed:
				t.Failed++
			}
		}
		slices.SortFunc(ok, func(a, b loadgen.Result) int { return int(a.Start - b.Start) })
		exact := set.Tenants[i].Clients == 1 && len(ok) == len(sps)
		waits := make([]time.Duration, 0, len(ok))
		for j, res := range ok {
			var w time.Duration
			if exact {
				w = sps[j].start.Sub(cr.started.Add(res.Start))
			} else {
				w = res.Total - median
			}
			waits = append(waits, max(w, 0))
		}
		slices.Sort(waits)
		t.WaitP50 = msOf(loadgen.Percentile(waits, 50))
		t.WaitP99 = msOf(loadgen.Percentile(waits, 99))
	}
	return out
}

// overlap is the length of [a0, a1] inside [b0, b1].
func overlap(a0, a1, b0, b1 time.Time) time.Duration {
	s, e := a0, a1
	if b0.After(s) {
		s = b0
	}
	if b1.Before(e) {
		e = b1
	}
	return max(e.Sub(s), 0)
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
			checks = append(checks, Check{Target: target, System: name, Value: "not measured: " + oneLine(run.Error, 160), Result: "FAIL"})
			continue
		}
		p := run.PairShare()
		if p < 0 {
			checks = append(checks, Check{Target: target, System: name, Value: "no permit-time measured", Result: "FAIL"})
			continue
		}
		l, s := run.tenant(TenantLong), run.tenant(TenantShort)
		value := fmt.Sprintf("long %.1f%%, short %.1f%% of their permit-time (%.1f / %.1f s; %.1f%% / %.1f%% of all, chat %.1f%%)",
			100*p, 100*(1-p), l.PermitS, s.PermitS, 100*l.PermitShare, 100*s.PermitShare, 100*shareOf(run, TenantChat))
		checks = append(checks, Check{Target: target, System: name, Value: value, Result: verdict(p >= 0.42 && p <= 0.58)})
	}
	return checks
}

func shareOf(run *FairRun, tenant string) float64 {
	if t := run.tenant(tenant); t != nil {
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
		w("\nNot measured: `%s`\n", oneLine(f.Error, 300))
		return
	}
	for _, run := range f.Runs {
		w("\n**%s**", run.Mode.Label)
		if run.Error != "" {
			w(": not measured: `%s`\n", oneLine(run.Error, 300))
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
		w("\n![Share of permit-time per tenant over time, per mode](%s)\n", plot)
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
