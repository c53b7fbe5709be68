package loadgen

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"
)

// Latency summarizes a set of durations, in milliseconds.
type Latency struct {
	// Count is the number of durations.
	Count int `json:"count"`
	// Mean, P50, P90, P99 and Max are in milliseconds, rounded to the
	// microsecond; percentiles are nearest-rank.
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Summarize returns the Latency of ds (which it sorts in place).
func Summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Latency{
		Count: len(ds),
		Mean:  ms(sum / time.Duration(len(ds))),
		P50:   ms(Percentile(ds, 50)),
		P90:   ms(Percentile(ds, 90)),
		P99:   ms(Percentile(ds, 99)),
		Max:   ms(ds[len(ds)-1]),
	}
}

// Percentile returns the p-th percentile (nearest rank) of sorted ds.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// TargetReport summarizes the requests sent to one target. Latencies
// count only requests with outcome ok.
type TargetReport struct {
	// Target is the base URL, or "all" for the whole run.
	Target string `json:"target"`
	// Sent, OK, Rejected and Failed count requests by outcome.
	Sent     int `json:"sent"`
	OK       int `json:"ok"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	// TTFB is the time to first byte: behind a queue, with a streaming
	// upstream, the wait for a permit.
	TTFB Latency `json:"ttfb"`
	// Total is the time to the end of the response.
	Total Latency `json:"total"`
}

// Report is the outcome of a run.
type Report struct {
	// Config is the run's configuration, defaults filled in.
	Config Config `json:"config"`
	// Started is when the run started; Elapsed its length in seconds,
	// until the last request ended.
	Started time.Time `json:"started"`
	Elapsed float64   `json:"elapsed_s"`
	// Sent, OK, Rejected, Failed and Canceled count requests by outcome.
	Sent     int `json:"sent"`
	OK       int `json:"ok"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	Canceled int `json:"canceled"`
	// Dropped counts open-loop arrivals not sent (MaxInFlight reached).
	Dropped int64 `json:"dropped,omitempty"`
	// Throughput is OK requests per second of the run.
	Throughput float64 `json:"throughput_rps"`
	// ByStatus counts requests per HTTP status ("0" for no response).
	ByStatus map[string]int `json:"by_status"`
	// ByReason counts rejects per Fair-Queue-Reason ("sse_error" when an
	// error event came without the header, "status" for a bare 429/503).
	ByReason map[string]int `json:"by_reason,omitempty"`
	// Errors counts failures per error message.
	Errors map[string]int `json:"errors,omitempty"`
	// Overall summarizes every request; Targets each target, in the
	// order of Config.Targets.
	Overall TargetReport   `json:"overall"`
	Targets []TargetReport `json:"targets"`
	// Results holds every request when Config.KeepResults is set.
	Results []Result `json:"results,omitempty"`
	// Upstream is filled in by the caller, e.g. from mockllm's /stats.
	Upstream map[string]any `json:"upstream,omitempty"`

	all []Result
}

// All returns every request's result, whether or not KeepResults is set.
func (rep *Report) All() []Result { return rep.all }

func newReport(cfg Config, started time.Time, elapsed time.Duration, results []Result, dropped int64) *Report {
	rep := &Report{
		Config:   cfg,
		Started:  started,
		Elapsed:  elapsed.Seconds(),
		Dropped:  dropped,
		ByStatus: map[string]int{},
		ByReason: map[string]int{},
		Errors:   map[string]int{},
		all:      results,
	}
	byTarget := map[string][]Result{}
	for _, res := range results {
		rep.Sent++
		rep.ByStatus[strconv.Itoa(res.Status)]++
		switch res.Outcome {
		case OutcomeOK:
			rep.OK++
		case OutcomeRejected:
			rep.Rejected++
			switch {
			case res.Reason != "":
				rep.ByReason[res.Reason]++
			case res.SSEError:
				rep.ByReason["sse_error"]++
			default:
				rep.ByReason["status"]++
			}
		case OutcomeCanceled:
			rep.Canceled++
		default:
			rep.Failed++
			if res.Err != "" {
				rep.Errors[res.Err]++
			}
		}
		byTarget[res.Target] = append(byTarget[res.Target], res)
	}
	if elapsed > 0 {
		rep.Throughput = math.Round(float64(rep.OK)/elapsed.Seconds()*10) / 10
	}
	rep.Overall = summarizeTarget("all", results)
	for i, t := range cfg.Targets {
		if !slices.Contains(cfg.Targets[:i], t) {
			rep.Targets = append(rep.Targets, summarizeTarget(t, byTarget[t]))
		}
	}
	if cfg.KeepResults {
		rep.Results = results
	}
	return rep
}

func summarizeTarget(target string, results []Result) TargetReport {
	tr := TargetReport{Target: target}
	var ttfb, total []time.Duration
	for _, res := range results {
		tr.Sent++
		switch res.Outcome {
		case OutcomeOK:
			tr.OK++
			ttfb = append(ttfb, res.TTFB)
			total = append(total, res.Total)
		case OutcomeRejected:
			tr.Rejected++
		case OutcomeFailed:
			tr.Failed++
		}
	}
	tr.TTFB = Summarize(ttfb)
	tr.Total = Summarize(total)
	return tr
}

// Durations returns the total latencies of the OK requests, sorted.
func (rep *Report) Durations() []time.Duration {
	var ds []time.Duration
	for _, res := range rep.all {
		if res.Outcome == OutcomeOK {
			ds = append(ds, res.Total)
		}
	}
	slices.Sort(ds)
	return ds
}

// WriteText writes the report as a human-readable summary.
func (rep *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "%s: %d sent in %.2fs, %.1f ok/s\n", rep.Config, rep.Sent, rep.Elapsed, rep.Throughput)
	fmt.Fprintf(w, "outcomes: ok %d, rejected %d, failed %d, canceled %d", rep.OK, rep.Rejected, rep.Failed, rep.Canceled)
	if rep.Dropped > 0 {
		fmt.Fprintf(w, ", dropped (over max in flight) %d", rep.Dropped)
	}
	fmt.Fprintf(w, "\nstatus: %s\n", counts(rep.ByStatus))
	if len(rep.ByReason) > 0 {
		fmt.Fprintf(w, "reject reasons: %s\n", counts(rep.ByReason))
	}
	if len(rep.Errors) > 0 {
		fmt.Fprintf(w, "errors: %s\n", counts(rep.Errors))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tsent\tok\trej\tfail\tttfb p50\tp90\tp99\tmax\ttotal p50\tp90\tp99\tmax\t")
	rows := append([]TargetReport{}, rep.Targets...)
	if len(rows) > 1 {
		rows = append(rows, rep.Overall)
	}
	for _, t := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			t.Target, t.Sent, t.OK, t.Rejected, t.Failed,
			fmtMS(t.TTFB.P50), fmtMS(t.TTFB.P90), fmtMS(t.TTFB.P99), fmtMS(t.TTFB.Max),
			fmtMS(t.Total.P50), fmtMS(t.Total.P90), fmtMS(t.Total.P99), fmtMS(t.Total.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "(latencies in ms, over ok requests; ttfb behind a queue with a streaming upstream = wait for a permit)")
	return err
}

func fmtMS(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// counts formats a count map as "k=v, ..." sorted by key.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := ""
	for i, k := range keys {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s=%d", k, m[k])
	}
	return s
}

// WriteWaitTable writes one row per target with the wait for a permit,
// measured as the time to first byte: meaningful for streamed answers
// from an upstream that sends its headers at once (mockllm does).
func (rep *Report) WriteWaitTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "node\trequests\tok\trejected\tfailed\twait p50 ms\twait p99 ms\twait max ms\t")
	rows := append([]TargetReport{}, rep.Targets...)
	if len(rows) > 1 {
		rows = append(rows, rep.Overall)
	}
	for _, t := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", t.Target, t.Sent, t.OK, t.Rejected, t.Failed,
			fmtMS(t.TTFB.P50), fmtMS(t.TTFB.P99), fmtMS(t.TTFB.Max))
	}
	return tw.Flush()
}
