package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// kneeUpstream answers like a server that runs `slots` requests at once
// and queues the others itself: a request's first byte comes at once
// while a slot is free, after a wait for one beyond (its time to first
// token grows past a knee of concurrency). It records how many requests
// it held at once (running and queued): what the limiter in front let
// through.
type kneeUpstream struct {
	mu      sync.Mutex
	slots   int
	running int
	queue   []chan struct{}
	inside  atomic.Int64
	hold    time.Duration
	peakMu  sync.Mutex
	peak    int64
}

func (k *kneeUpstream) setSlots(n int) {
	k.mu.Lock()
	k.slots = n
	k.wakeLocked()
	k.mu.Unlock()
}

func (k *kneeUpstream) wakeLocked() {
	for k.running < k.slots && len(k.queue) > 0 {
		k.running++
		close(k.queue[0])
		k.queue = k.queue[1:]
	}
}

// takePeak returns the most requests held at once since the last call.
func (k *kneeUpstream) takePeak() int64 {
	k.peakMu.Lock()
	defer k.peakMu.Unlock()
	p := k.peak
	k.peak = k.inside.Load()
	return p
}

func (k *kneeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n := k.inside.Add(1)
	defer k.inside.Add(-1)
	k.peakMu.Lock()
	k.peak = max(k.peak, n)
	k.peakMu.Unlock()
	k.mu.Lock()
	if k.running < k.slots && len(k.queue) == 0 {
		k.running++
		k.mu.Unlock()
	} else {
		ch := make(chan struct{})
		k.queue = append(k.queue, ch)
		k.mu.Unlock()
		<-ch
	}
	defer func() {
		k.mu.Lock()
		k.running--
		k.wakeLocked()
		k.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
	http.NewResponseController(w).Flush()
	time.Sleep(k.hold)
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// share reads the learned share of queue name from the instance's
// metrics (caddy_fair_queue_capacity_share).
func share(t *testing.T, c *harness.Caddy, name string) float64 {
	t.Helper()
	return gaugeOr(t, c, `caddy_fair_queue_capacity_share{queue="`+name+`"} `, 1)
}

// upstreamShare reads the learned share of one upstream of queue name
// (caddy_fair_queue_upstream_capacity_share).
func upstreamShare(t *testing.T, c *harness.Caddy, name, upstream string) float64 {
	t.Helper()
	return gaugeOr(t, c, `caddy_fair_queue_upstream_capacity_share{queue="`+name+`",upstream="`+upstream+`"} `, 1)
}

// gaugeOr reads the sample of the instance's metrics that starts with
// prefix (its name and labels), or def when there is none.
func gaugeOr(t *testing.T, c *harness.Caddy, prefix string, def float64) float64 {
	t.Helper()
	for _, line := range strings.Split(scrape(t, c), "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			require.NoError(t, err)
			return v
		}
	}
	return def
}

// shortChat is a streaming chat of one short message.
const shortChat = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// load sends body from clients loops to the instances in turn until ctx
// ends; failed counts the answers that were not 200.
func load(ctx context.Context, wg *sync.WaitGroup, clients int, caddies []*harness.Caddy, body string, failed *atomic.Int64) {
	for i := range clients {
		c := caddies[i%len(caddies)]
		wg.Go(func() {
			client := &http.Client{}
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/chat/completions", strings.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
}

// Two instances on one Redis, permits 32, in front of an upstream whose
// time to first token passes the target beyond 4 requests at once: the
// learned capacity comes down from 32 to around the knee, one value for
// both instances (together they let through about the knee, not twice
// it), and goes up again when the knee moves to 16.
func TestAdaptiveCapacitySettlesAtTheKneeAndFollowsIt(t *testing.T) {
	rds := redistest.Start(t)
	knee := &kneeUpstream{slots: 4, hold: 150 * time.Millisecond}
	srv := httptest.NewServer(knee)
	t.Cleanup(srv.Close)
	site := proxySite(strings.TrimPrefix(srv.URL, "http://"), fmt.Sprintf(`
	fair_queue {
		name learn
		permits 32
		max_wait 1m
		adaptive {
			target_ttft 75ms
			interval 200ms
			decrease 0.8
			step 0.05
			floor 0.05
			min_samples 20
		}
		redis redis://%s/0
	}`, rds.Addr()))
	caddies := []*harness.Caddy{harness.StartCaddy(t, "caddy-0", site, harness.CaddyOptions{}), harness.StartCaddy(t, "caddy-1", site, harness.CaddyOptions{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	load(ctx, &wg, 40, caddies, shortChat, &failed)
	settle := func(what string, ok func(s float64, peak int64) bool) (float64, int64) {
		var s float64
		var peak int64
		deadline := time.Now().Add(40 * time.Second)
		for time.Now().Before(deadline) {
			time.Sleep(2 * time.Second)
			s, peak = share(t, caddies[0], "learn"), knee.takePeak()
			t.Logf("%s: share %.3f (%d permits), the upstream held at most %d in the last 2 s", what, s, int(32*s), peak)
			if ok(s, peak) {
				return s, peak
			}
		}
		t.Fatalf("%s: not reached; share %.3f, peak %d", what, s, peak)
		return s, peak
	}
	// Down to about the knee: at most 8 permits, and the upstream holds
	// what both instances let through together.
	s, _ := settle("knee at 4", func(s float64, peak int64) bool { return int(32*s) <= 8 && peak <= 9 })
	assert.GreaterOrEqual(t, int(32*s), 2, "not below the floor of the knee's half")
	assert.InDelta(t, s, share(t, caddies[1], "learn"), 0.25, "the other instance grants under the same share")
	knee.setSlots(16)
	settle("knee at 16", func(s float64, _ int64) bool { return int(32*s) >= 12 })
	cancel()
	wg.Wait()
	assert.Zero(t, failed.Load(), "no client saw an error")
}

// A pool of two such upstreams, knees at 8 each, permits 16 each: when
// one replica slows down (its knee halves to 4), its own capacity comes
// down and the other's stays: each replica learns from its own answers.
func TestAdaptiveCapacityOfAPoolFollowsTheReplicaThatSlowsDown(t *testing.T) {
	rds := redistest.Start(t)
	knees := []*kneeUpstream{{slots: 8, hold: 150 * time.Millisecond}, {slots: 8, hold: 150 * time.Millisecond}}
	var b strings.Builder
	b.WriteString("\tfair_queue {\n\t\tname learnpool\n\t\tmax_wait 1m\n")
	var dials []string
	for _, k := range knees {
		srv := httptest.NewServer(k)
		t.Cleanup(srv.Close)
		dial := strings.TrimPrefix(srv.URL, "http://")
		dials = append(dials, dial)
		fmt.Fprintf(&b, "\t\tupstream %s 16\n", dial)
	}
	fmt.Fprintf(&b, "\t\tadaptive {\n\t\t\ttarget_ttft 75ms\n\t\t\tinterval 200ms\n\t\t\tdecrease 0.8\n\t\t\tstep 0.05\n\t\t\tmin_samples 20\n\t\t}\n")
	fmt.Fprintf(&b, "\t\tredis redis://%s/0\n\t}\n", rds.Addr())
	b.WriteString("\treverse_proxy {\n\t\tdynamic fair_queue\n\t\tflush_interval -1\n\t}")
	caddies := []*harness.Caddy{harness.StartCaddy(t, "caddy-0", b.String(), harness.CaddyOptions{}), harness.StartCaddy(t, "caddy-1", b.String(), harness.CaddyOptions{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	load(ctx, &wg, 48, caddies, shortChat, &failed)
	wait := func(what string, ok func(a, b float64) bool) {
		deadline := time.Now().Add(40 * time.Second)
		for {
			time.Sleep(2 * time.Second)
			a, b := upstreamShare(t, caddies[0], "learnpool", dials[0]), upstreamShare(t, caddies[0], "learnpool", dials[1])
			t.Logf("%s: a %.3f (%d permits), b %.3f (%d permits)", what, a, int(16*a), b, int(16*b))
			if ok(a, b) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached", what)
			}
		}
	}
	wait("both at their knee of 8", func(a, b float64) bool { return int(16*a) <= 10 && int(16*b) <= 10 })
	knees[0].setSlots(3) // replica a slows down
	wait("a slowed down", func(a, b float64) bool { return int(16*a) <= 4 && int(16*b) >= 6 })
	cancel()
	wg.Wait()
	assert.Zero(t, failed.Load(), "no client saw an error")
}

// In front of the GPU-shaped mock, a target no answer breaches and the
// backend's own gauges read (backend_metrics): the mock preempts while
// fair_queue lets 32 requests of 300 tokens into a cache of 2,000, so
// the learned capacity comes down until it stops preempting, and settles
// above the floor.
func TestAdaptiveCapacityFollowsTheBackendsPreemptions(t *testing.T) {
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{GPU: mockllm.GPUConfig{KVTokens: 2000, MaxNumSeqs: 64,
		StepBase: 5 * time.Millisecond, StepPerSeq: 100 * time.Microsecond}})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name gauges
		permits 32
		max_wait 1m
		adaptive {
			target_ttft 1m
			interval 250ms
			decrease 0.7
			step 0.05
			min_samples 10
			floor 0.05
			backend_metrics http://%s/metrics
		}
	}`, upstream))
	c := harness.StartCaddy(t, "caddy-0", site, harness.CaddyOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	body := `{"model":"m","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("a", 800) + `"}]}`
	load(ctx, &wg, 32, []*harness.Caddy{c}, body, &failed)
	// Down, the share saw-tooths below the cache's size (docs/adaptive.md):
	// the top of a tooth may preempt again, so two quiet readings in a
	// row come when they come, about every half minute, sometimes after a
	// minute or more (a reading takes more than 2s on a loaded machine).
	var before int64
	quiet := 0
	deadline := time.Now().Add(3 * time.Minute)
	for quiet < 2 {
		require.True(t, time.Now().Before(deadline), "the backend still preempts")
		time.Sleep(2 * time.Second)
		s, st := share(t, c, "gauges"), mock.Stats().GPU
		t.Logf("share %.3f (%d permits), %d preemptions so far, running %d", s, int(32*s), st.Preemptions, st.Running)
		if st.Preemptions == before && s < 1 {
			quiet++
		} else {
			quiet = 0
		}
		before = st.Preemptions
	}
	s := share(t, c, "gauges")
	assert.Less(t, s, 0.5, "the capacity came down from 32 (300 x 32 tokens do not fit 2,000)")
	assert.Greater(t, s, 0.05, "and is not stuck at the floor: no preemption, requests waiting, it climbs back")
	cancel()
	wg.Wait()
	assert.Zero(t, failed.Load(), "no client saw an error")
}
