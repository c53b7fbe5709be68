package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A requeue_on refusal whose body breaks off (the upstream closes the
// connection before its Content-Length, as a server going down does) is
// held back and requeued like any other: reverse_proxy aborts such an
// answer with a panic, which must not reach the client, who has seen
// nothing of the refusal.
func TestARefusalWhoseBodyBreaksOffIsRequeued(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			breakOff(w)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"answer":"ok"}`)
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-broken-body","upstreams":[{"dial":%q,"permits":1}],
			"requeue_on":[503],"upstream_cooldown":"10ms"}`, strings.TrimPrefix(up.URL, "http://")),
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)

	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err, "the client's connection was cut")
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `{"answer":"ok"}`, string(body), "the answer of the second sending")
	assert.Equal(t, int32(2), calls.Load(), "sent again after the refusal")
}

// The same on a stream the keepalive committed while it waited: the
// refusal is held back from the open stream, and the stream goes on
// with the events of the second sending.
func TestARefusalWhoseBodyBreaksOffIsRequeuedOnACommittedStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "requeue-broken-body-stream"
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hold" {
			<-release // holds the only permit while the stream waits
			return
		}
		if calls.Add(1) == 1 {
			breakOff(w)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1}],"requeue_on":[503],
			"upstream_cooldown":"10ms","sse_keepalive":"100ms","max_wait":"10s"}`, name, strings.TrimPrefix(up.URL, "http://")),
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
	go func() {
		if resp, err := http.Post(url+"/hold", "application/json", strings.NewReader(`{}`)); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
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
	var data []string
	for _, b := range rest(t, ch) {
		if strings.HasPrefix(b, "data: ") {
			data = append(data, b)
		}
	}
	assert.Equal(t, []string{`data: {"choices":[]}`, "data: [DONE]"}, data, "the second sending's events")
	assert.Equal(t, int32(2), calls.Load(), "sent again after the refusal")
}

// breakOff answers 503 with a body that breaks off: the connection
// closes 91 bytes short of its Content-Length.
func breakOff(w http.ResponseWriter) {
	w.Header().Set("Content-Length", "100")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, `{"error":`)
	_ = http.NewResponseController(w).Flush()
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}
