package report

// The capacity scenario's plots: each case's replicas over time.

import (
	"fmt"
	"path/filepath"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// capacityPlotFile is the plot of one case's samples.
func capacityPlotFile(cs *CapacityCase) string {
	return "capacity-" + cs.Topology + "-" + cs.Workload + ".png"
}

// writeCapacityPlots draws, per case, the replicas' KV tokens, running
// and waiting requests over time (summed over the replicas), one line per
// system: the backend alone, HAProxy, and the best and the worst fixed
// permits. It returns the files written.
func writeCapacityPlots(c *Capacity, dir string) ([]string, error) {
	if c == nil {
		return nil, nil
	}
	var written []string
	for _, cs := range c.Cases {
		var runs []*CapacityRun
		for _, r := range cs.Runs {
			if r.Error != "" || len(r.Samples) == 0 {
				continue
			}
			if r.Row.Kind != systems.KindFairQueue || r.Row.Permits == cs.BestPermits || r.Row.Permits == cs.WorstPermits {
				runs = append(runs, r)
			}
		}
		if len(runs) == 0 {
			continue
		}
		panels := []struct {
			ylabel string
			value  func(CapacitySample) float64
		}{
			{"KV tokens held", func(s CapacitySample) float64 { return float64(s.KVUsed) }},
			{"requests running", func(s CapacitySample) float64 { return float64(s.Running) }},
			{"waiting in the server", func(s CapacitySample) float64 { return float64(s.Waiting) }},
		}
		kv := 0.0
		if t := c.topology(cs.Topology); t != nil {
			for _, r := range t.Replicas {
				kv += float64(r.KVTokens)
			}
		}
		var plots []*plot.Plot
		for pi, panel := range panels {
			p := plot.New()
			if pi == 0 {
				p.Title.Text = fmt.Sprintf("Capacity: %s, %s", cs.Topology, cs.Workload)
			}
			p.X.Label.Text = "time since the first arrival (s)"
			p.Y.Label.Text = panel.ylabel
			p.Y.Min = 0
			p.Add(plotter.NewGrid())
			p.Legend.Top = true
			for i, r := range runs {
				xys := make(plotter.XYs, len(r.Samples))
				for j, s := range r.Samples {
					xys[j] = plotter.XY{X: s.AtS, Y: panel.value(s)}
				}
				if err := addLine(p, i, r.Row.Label, xys); err != nil {
					return written, err
				}
			}
			if pi == 0 && kv > 0 && len(runs[0].Samples) > 1 {
				end := runs[0].Samples[len(runs[0].Samples)-1].AtS
				for _, r := range runs {
					end = max(end, r.Samples[len(r.Samples)-1].AtS)
				}
				l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: kv}, {X: end, Y: kv}})
				if err != nil {
					return written, err
				}
				l.Dashes = plotutil.Dashes(2)
				p.Add(l)
				p.Legend.Add("KV cache size", l)
			}
			if pi > 0 {
				p.Legend = plot.NewLegend() // one legend, on the first panel
			}
			plots = append(plots, p)
		}
		file := capacityPlotFile(cs)
		if err := savePanels(plots, 18*vg.Centimeter, 24*vg.Centimeter, filepath.Join(dir, file)); err != nil {
			return written, err
		}
		written = append(written, file)
	}
	return written, nil
}
