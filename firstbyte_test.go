package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstByteSamples reads the count and sum of queue's time to first byte.
func firstByteSamples(t *testing.T, queue, upstream string) (uint64, float64) {
	t.Helper()
	initMetrics()
	var m dto.Metric
	require.NoError(t, metrics.firstByte.WithLabelValues(queue, upstream).(interface{ Write(*dto.Metric) error }).Write(&m))
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestTimeToFirstByteCountsFromTheForwardToTheFirstEvent: an upstream
// that thinks 300 ms before its first event, then streams for 2 s more,
// is observed once, at its first event, not at its answer's end.
func TestTimeToFirstByteCountsFromTheForwardToTheFirstEvent(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "first-byte"
	h := provisionLocal(t, newContext(t), &Handler{Name: name, Permits: 1})
	upstream := proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the header alone is not a first byte of the answer
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(w, "data: {\"choices\":[]}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(2 * time.Second)
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	srv := serve(t, h, upstream)
	n0, sum0 := firstByteSamples(t, name, "")

	resp := srv.post(t, context.Background(), `{"stream":true}`)
	_, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "granted", srv.outcome(t))

	n, sum := firstByteSamples(t, name, "")
	require.Equal(t, n0+1, n, "one answer, one observation")
	ttfb := sum - sum0
	assert.GreaterOrEqual(t, ttfb, 0.3, "from the forward to the first event")
	assert.Less(t, ttfb, 2.0, "at the first event, not at the answer's end (2.3 s)")
}

// The time to first byte of a requeued stream is its upstream's, from
// the forward that the upstream answered: not the moment the keepalive
// fed the client while the request waited again. (Adaptive learns the
// upstream's capacity from it.)
func TestRequeuedStreamTimesItsFirstByteFromTheUpstream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "fb-requeue"
	h := provisionLocal(t, newContext(t), &Handler{Name: name,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}, RequeueOn: []int{503},
		SSEKeepalive: caddy.Duration(100 * time.Millisecond)})
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		if call == 1 {
			return refuse(w, http.StatusServiceUnavailable, "1") // the upstream cools 1 s: the request waits again
		}
		time.Sleep(300 * time.Millisecond) // the upstream thinks
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
		return nil
	}}
	n0, sum0 := firstByteSamples(t, name, "a:1")
	req := newRequest(context.Background(), `{"model":"m","stream":true,"messages":[]}`)
	req.r = req.r.WithContext(context.WithValue(req.r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	req.start(h, next).wait(t)
	require.NoError(t, req.err)
	require.Len(t, next.calls, 2)
	require.Contains(t, req.w.Body.String(), ": queued", "the keepalive fed the client while it waited again")
	n, sum := firstByteSamples(t, name, "a:1")
	require.Equal(t, n0+1, n)
	assert.GreaterOrEqual(t, sum-sum0, 0.3, "the upstream's first byte came 300 ms after the forward")
}

// An upstream's error on a stream the keepalive committed reaches the
// client as an error event that fair_queue writes: it is no first byte
// of the upstream's answer, and the time to first byte counts none.
func TestAnErrorEventOnACommittedStreamIsNoFirstByte(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "fb-error-event"
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hold" {
			<-release // holds the only permit; answers no body
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"boom"}}`)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"10s","sse_keepalive":"100ms"}`, name),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.URL, "http://")))
	n0, _ := firstByteSamples(t, name, "")

	held := make(chan error, 1)
	go func() {
		resp, err := http.Post(url+"/hold", "application/json", strings.NewReader(`{}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		held <- err
	}()
	require.Eventually(t, func() bool {
		for _, q := range queueStatus(t.Context()).Queues {
			if q.Name == name && q.Stats.InFlight == 1 {
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond, "the holder runs")

	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	ch := events(resp.Body)
	require.Regexp(t, `^: queued`, nextEvent(t, ch), "the stream is committed")
	close(release)
	require.NoError(t, <-held)
	blocks := rest(t, ch)
	require.NotEmpty(t, blocks)
	require.Equal(t, "event: error\ndata: {\"error\":{\"message\":\"boom\"}}", blocks[len(blocks)-1])
	require.Eventually(t, func() bool {
		for _, q := range queueStatus(t.Context()).Queues {
			if q.Name == name && q.Stats.InFlight == 0 {
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond, "both requests finished")

	n, _ := firstByteSamples(t, name, "")
	assert.Equal(t, n0, n, "neither answer had a first byte from its upstream")
}
