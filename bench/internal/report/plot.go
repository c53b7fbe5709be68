package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot file names, in the output directory.
const (
	PlotCDFSaturated = "latency-cdf-saturated.png"
	PlotCDFLowLoad   = "latency-cdf-low-load.png"
	PlotWaitVsRate   = "wait-vs-arrival-rate.png"
)

// WritePlots draws the latency CDFs per system and the wait against the
// arrival rate, and returns the file names written.
func WritePlots(res *Results, dir string) ([]string, error) {
	var written []string
	// cdf draws one CDF per system, the legend in the bottom right corner
	// moved by (dx, dy) off the curves.
	cdf := func(file, title string, dx, dy vg.Length, pick func(*System) *LoadRun) error {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "latency (ms, log scale)"
		p.Y.Label.Text = "fraction of requests"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = ticks125{}
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.XOffs, p.Legend.YOffs = dx, dy
		p.Add(plotter.NewGrid())
		n := 0
		for i, s := range res.Systems {
			run := pick(s)
			if run == nil || len(run.CDF) == 0 {
				continue
			}
			xys := make(plotter.XYs, len(run.CDF))
			for j, v := range run.CDF {
				xys[j].X = max(v, 0.001) // log scale: no zero
				xys[j].Y = float64(j+1) / float64(len(run.CDF))
			}
			if err := addLine(p, i, s.Spec.Label, xys); err != nil {
				return err
			}
			n++
		}
		if n == 0 {
			return nil
		}
		if err := p.Save(18*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, file)); err != nil {
			return err
		}
		written = append(written, file)
		return nil
	}
	set := res.Settings
	if err := cdf(PlotCDFSaturated, fmt.Sprintf("Latency CDF, %d clients, %d permits, %.0f ms upstream",
		set.Clients, set.Permits, set.ServiceMS), -3.5*vg.Centimeter, 2*vg.Centimeter,
		func(s *System) *LoadRun { return s.Saturated }); err != nil {
		return written, err
	}
	if err := cdf(PlotCDFLowLoad, "Latency CDF at low load (1 client, instant upstream)", 0, 0,
		func(s *System) *LoadRun { return s.LowLoad }); err != nil {
		return written, err
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("Wait for a permit vs arrival rate (%d permits, %.0f ms streams)",
		set.Permits, float64(set.StreamTokens)*set.StreamTokenMS)
	p.X.Label.Text = "arrival rate (req/s)"
	p.Y.Label.Text = "wait (time to first byte, ms): solid p50, dashed p99"
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	n := 0
	for i, s := range res.Systems {
		if len(s.OpenLoop) == 0 {
			continue
		}
		p50 := make(plotter.XYs, len(s.OpenLoop))
		p99 := make(plotter.XYs, len(s.OpenLoop))
		for j, pt := range s.OpenLoop {
			p50[j] = plotter.XY{X: pt.Rate, Y: pt.WaitP50}
			p99[j] = plotter.XY{X: pt.Rate, Y: pt.WaitP99}
		}
		if err := addLine(p, i, s.Spec.Label+" p50", p50); err != nil {
			return written, err
		}
		l, err := plotter.NewLine(p99)
		if err != nil {
			return written, err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(2)
		p.Add(l)
		n++
	}
	if n > 0 {
		if err := p.Save(18*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, PlotWaitVsRate)); err != nil {
			return written, err
		}
		written = append(written, PlotWaitVsRate)
	}
	ok, err := writeFairnessPlot(res.Fairness, filepath.Join(dir, PlotFairness))
	if ok {
		written = append(written, PlotFairness)
	}
	if err != nil {
		return written, err
	}
	llm, err := writeLLMPlots(res.LLM, dir)
	written = append(written, llm...)
	if err != nil {
		return written, err
	}
	capacity, err := writeCapacityPlots(res.Capacity, dir)
	return append(written, capacity...), err
}

// addLine adds a solid line in the i-th color, with a legend entry.
func addLine(p *plot.Plot, i int, label string, xys plotter.XYs) error {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(i)
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(label, l)
	return nil
}

// ticks125 marks a log axis at 1, 2 and 5 times each power of ten.
type ticks125 struct{}

// Ticks implements plot.Ticker.
func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}

// savePanels draws plots one above the other, aligned, in one PNG of
// w x h.
func savePanels(plots []*plot.Plot, w, h vg.Length, file string) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter, PadY: 3 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
