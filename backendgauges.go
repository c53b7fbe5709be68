package caddyfairqueue

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Reading an adaptive queue's backend gauges (adaptive backend_metrics):
// every interval, each backend's Prometheus text (vLLM's or SGLang's
// /metrics) is read; each request it preempted since the last read
// (vllm:num_preemptions_total; SGLang's retracted requests,
// sglang:num_retracted_requests_total) and each reading of requests
// queued in it (vllm:num_requests_waiting or sglang:num_queue_reqs > 0)
// counts as a time to first token above the target, and each reading as
// one sample of the window
// (fairqueue.Queue.ObserveOverload): more of them than breach_share of
// the window's samples moves its share down; a window of readings that
// showed none, while requests waited, moves it up. A value starting
// with "/" is a path on each pool upstream (http://<dial><path>); else it
// is the URL of the one backend of a queue without a pool.

// maxReadPreemptions bounds the preemptions one read counts: far above
// any real engine's, and summed over a window's reads (the Redis store
// adds them with HINCRBY) still far from overflowing.
const maxReadPreemptions = 1 << 30

// gaugeWatch reads an engine's backend gauges until stopped.
type gaugeWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// watchGauges starts reading e's backend gauges while its settings ask
// for it (they may change with reloads); nil when the queue is not
// adaptive at its start. Each backend is read every interval on its own:
// one whose read hangs (its host gone) until the read's timeout (the
// interval) is read again at the first tick after, and never holds back
// the reads of the others.
func watchGauges(e *engine) *gaugeWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &gaugeWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		// A transport of its own: closing its idle connections at the
		// stop must not close those of http.DefaultTransport, which
		// other users in the process (other Caddy modules) keep alive.
		client := &http.Client{Transport: newGaugeTransport()}
		defer client.CloseIdleConnections()
		var reads sync.WaitGroup
		defer reads.Wait() // ended by ctx
		results := make(chan gaugeReading)
		// Preemptions per URL at its last read: by URL, not by share key,
		// so that a reload pointing a share at another backend starts
		// afresh, as a first read does, instead of counting every
		// preemption since that backend started.
		last := map[string]float64{}
		current := map[string]string{} // the share key of each URL read, as of the last tick
		reading := map[string]bool{}   // the URLs whose read runs
		every := gaugeInterval(e.q.Config())
		tick := time.NewTimer(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-results:
				delete(reading, r.url)
				if key, ok := current[r.url]; ok && key == r.key { // else no more read, or for another share: dropped
					countGauges(e, last, r)
				}
				continue
			case <-tick.C:
			}
			cfg := e.q.Config()
			every = gaugeInterval(cfg)
			tick.Reset(every)
			clear(current)
			if cfg.Adaptive != nil && cfg.Adaptive.BackendMetrics != "" {
				for key, url := range gaugeURLs(cfg) {
					current[url] = key
				}
			}
			maps.DeleteFunc(last, func(url string, _ float64) bool {
				_, read := current[url]
				return !read // read again later, it starts afresh
			})
			for url, key := range current {
				if reading[url] {
					continue // its last read still runs (its timeout: the interval)
				}
				reading[url] = true
				timeout := every
				reads.Go(func() {
					g, err := readGaugesShared(ctx, e, client, url, timeout)
					select {
					case results <- gaugeReading{key: key, url: url, g: g, err: err}:
					case <-ctx.Done():
					}
				})
			}
		}
	}()
	return w
}

// newGaugeTransport is the transport of one gauge watch: the settings of
// http.DefaultTransport, but its own connections. A shared read that
// outlives its watch (readGaugesShared) leaves its connection idle, closed
// after IdleConnTimeout.
func newGaugeTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// gaugeReading is one read of a backend's gauges, for share key.
type gaugeReading struct {
	key, url string
	g        backendGauges
	err      error
}

// gaugeInterval is how often an engine under cfg reads its backend gauges.
func gaugeInterval(cfg fairqueue.Config) time.Duration {
	if a := cfg.Adaptive; a != nil && a.Interval > 0 {
		return a.Interval
	}
	return fairqueue.DefaultAdaptiveInterval
}

// countGauges tells e's queue what reading r showed, the preemptions
// counted from last's (by URL), which it updates. A read that failed is
// skipped (logged where it was read: logReadStreak).
func countGauges(e *engine, last map[string]float64, r gaugeReading) {
	if r.err != nil {
		return
	}
	g := r.g
	n := 0
	// A counter that is no number (+Inf, NaN) says nothing of this read's
	// preemptions: the next read counts from the last one that did. One
	// past what an int holds counts as maxReadPreemptions: converted, it
	// would turn negative and drop the reading.
	if prev, seen := last[r.url]; !math.IsInf(g.preemptions, 0) && !math.IsNaN(g.preemptions) {
		last[r.url] = g.preemptions
		if seen && g.preemptions > prev {
			n = int(min(g.preemptions-prev, maxReadPreemptions)) // each preempted request
		}
	}
	if g.waiting > 0 {
		n++ // a reading of requests queued in the backend
	}
	e.q.ObserveOverload(r.key, n)
}

// stop ends the watch and waits for it.
func (w *gaugeWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// gaugeURLs maps each share key ("" or an upstream's dial) to the URL of
// its backend's gauges.
func gaugeURLs(cfg fairqueue.Config) map[string]string {
	src := cfg.Adaptive.BackendMetrics
	out := map[string]string{}
	if !strings.HasPrefix(src, "/") {
		if len(cfg.Upstreams) == 0 {
			out[""] = src
		}
		return out
	}
	for _, u := range cfg.Upstreams {
		out[u.Dial] = "http://" + u.Dial + src
	}
	return out
}

// backendGauges are the gauges read from one backend.
type backendGauges struct {
	preemptions, waiting float64
}

// readGauges reads the preemptions and waiting requests from url's
// Prometheus text, under vLLM's names or SGLang's (every series of each
// name summed: SGLang's are per rank). SGLang's sglang:num_retracted_reqs
// is left out: a gauge of the last logged batch's retractions, not a
// count since the last read, and it keeps its value while the engine
// logs no batch, an idle one too. A page without the requests queued
// (vllm:num_requests_waiting or sglang:num_queue_reqs: both engines always
// show theirs) is no engine's gauges (another engine's metrics, a page
// answered on a wrong path): the read failed, as a read answered with an
// error status, and is skipped; read as a backend that neither preempts
// nor queues, it would be a sample under the target.
func readGauges(ctx context.Context, client *http.Client, url string, timeout time.Duration) (backendGauges, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return backendGauges{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return backendGauges{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// A read that fails is skipped: read as no preemption at all, it
		// would count every one since the backend started at the next.
		return backendGauges{}, fmt.Errorf("backend gauges: %s", resp.Status)
	}
	var g backendGauges
	queue := false // the requests queued were shown
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, rest := sampleName(sc.Text())
		var dst *float64
		switch name {
		case "vllm:num_preemptions_total", "sglang:num_retracted_requests_total":
			dst = &g.preemptions
		case "vllm:num_requests_waiting", "sglang:num_queue_reqs":
			dst = &g.waiting
		default:
			continue
		}
		if fields := strings.Fields(rest); len(fields) > 0 {
			if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
				*dst += v
				queue = queue || dst == &g.waiting
			}
		}
	}
	if err := sc.Err(); err != nil {
		return backendGauges{}, err
	}
	if !queue {
		return backendGauges{}, fmt.Errorf("backend gauges: neither vllm:num_requests_waiting nor sglang:num_queue_reqs shown: not vLLM's or SGLang's metrics")
	}
	return g, nil
}

// sampleName splits a Prometheus text line into its metric name and what
// follows its labels: the value (and perhaps a timestamp).
func sampleName(line string) (name, rest string) {
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return line, ""
	}
	name, rest = line[:i], line[i:]
	if rest[0] == '{' {
		if j := strings.LastIndexByte(rest, '}'); j >= 0 {
			rest = rest[j+1:]
		}
	}
	return name, rest
}
