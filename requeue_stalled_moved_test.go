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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request whose upstream refused it (requeue_on) and stalled the
// refusal's body, while a reload moved its queue to another store
// (the local store to Redis), gets the timeout reject at max_wait as
// any other: its queue's move is no shutdown of the server
// (shutting_down), and a requeue would have waited on in the queue in
// force.
func TestAStalledRefusalWhoseQueueMovedEndsInTheTimeoutReject(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	refusing := make(chan struct{})
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Quick") != "" {
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":`)
		_ = http.NewResponseController(w).Flush()
		close(refusing)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { close(release) })
	port := freePort(t)
	config := func(store string) string {
		return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
			{"handler":"fair_queue","name":"stalled-moved","upstreams":[{"dial":%q,"permits":1}],%s
			 "requeue_on":[503],"upstream_cooldown":"100ms","max_wait":"4s"},
			{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`,
			port, strings.TrimPrefix(upstream.URL, "http://"), store)
	}
	require.NoError(t, caddy.Load([]byte(config("")), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	client := &http.Client{Timeout: 20 * time.Second}

	type answer struct {
		code   int
		reason string
		err    error
	}
	stalled := make(chan answer, 1)
	go func() {
		resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		if err != nil {
			stalled <- answer{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		stalled <- answer{code: resp.StatusCode, reason: resp.Header.Get("Fair-Queue-Reason")}
	}()
	select {
	case <-refusing:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached its upstream")
	}

	// The next config keeps the queue in Redis; its first request moves
	// the old queue there.
	reload(t, config(fmt.Sprintf(`"redis":{"addresses":[%q]},`, rds.Addr())))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{}`))
		req.Header.Set("X-Quick", "1")
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool {
		for _, e := range openEngines() {
			if e.name == "stalled-moved" && !e.remote && e.moved.Load() {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "the old queue moved")
	select {
	case a := <-stalled:
		t.Fatalf("the stalled request was answered before its queue moved (%+v): max_wait too short for this machine", a)
	default:
	}

	var a answer
	select {
	case a = <-stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer to the stalled request")
	}
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusTooManyRequests, a.code)
	assert.Equal(t, "timeout", a.reason)
}
