package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A backend that is down (its port refuses connections, or its dial
// times out) is not an overloaded one: a stream that reverse_proxy could
// not forward at all, however long it tried (lb_try_duration, a
// dial_timeout), had no time to first token. Counted above the target,
// an outage of a minute would pull the learned capacity down to its
// floor, from where it climbs back by a step an interval once the
// backend is up again, serving far below what it could. The pool's
// cooldown is what keeps requests off an unreachable upstream. Here two
// streams fail to reach the backend for 600 ms each (target 300 ms);
// then the backend comes up and answers one stream in time: the share
// must stay whole. So too where the stream waited behind another and the
// keepalive committed it (reverse_proxy's failure, its 502 or its 503,
// is then relayed as an error event, its status noted as the answer's).
func TestAdaptiveDoesNotCountAStreamThatNeverReachedTheBackend(t *testing.T) {
	for _, tc := range []struct {
		name string
		// health: reverse_proxy's health_checks ("": none)
		health string
		// status: what a stream reverse_proxy could not forward gets
		status int
		// committed: each stream waits behind another, and the
		// keepalive commits it
		committed bool
	}{
		{"its dials are refused", "", http.StatusBadGateway, false},
		// Its active health check finds it down: no upstream available.
		{"its health check fails", unreachedHealthCheck, http.StatusServiceUnavailable, false},
		{"its dials are refused, the stream committed", "", http.StatusBadGateway, true},
		{"its health check fails, the stream committed", unreachedHealthCheck, http.StatusServiceUnavailable, true},
	} {
		t.Run(tc.name, func(t *testing.T) { unreachedStreams(t, tc.health, tc.status, tc.committed) })
	}
}

// unreachedHealthCheck is reverse_proxy's active health check of a
// backend that is down.
const unreachedHealthCheck = `"health_checks":{"active":{"uri":"/health","interval":"100ms","timeout":"1s"}},`

func unreachedStreams(t *testing.T, health string, status int, committed bool) {
	t.Cleanup(func() { poolEmpty(t) })
	name := fmt.Sprintf("adapt-unreached-%d-%t", status, committed)
	backend := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nobody listens: refused
	queue := `"permits":4`
	if committed {
		queue = `"permits":1,"sse_keepalive":"100ms"` // the second of two streams waits
	}
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,%s,
		 "adaptive":{"target_ttft":"300ms","min_samples":1,"interval":"100ms","decrease":0.5}},
		{"handler":"reverse_proxy","flush_interval":-1,%s
		 "load_balancing":{"try_duration":"600ms","try_interval":"150ms"},"upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, name, queue, health, backend)
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	// answer is a stream's status, and whether it failed as the case
	// says (its status, or on a committed stream an error event that
	// names it).
	type answer struct {
		status int
		as     bool
	}
	stream := func() answer {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"m","stream":true}`))
		if !assert.NoError(t, err) {
			return answer{}
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if !assert.NoError(t, err) {
			return answer{}
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(b), "event: error") {
			return answer{resp.StatusCode, strings.Contains(string(b), fmt.Sprintf("status %d", status))}
		}
		return answer{resp.StatusCode, resp.StatusCode == status}
	}
	// Streams the backend's outage fails, each after reverse_proxy
	// tried for 600 ms, until two of them failed as the case says
	// (before the first health check, a dial is refused); committed,
	// until two committed ones did, each waiting behind another.
	for failed := 0; failed < 2; {
		start := time.Now()
		if committed {
			ahead := make(chan answer, 1)
			go func() { ahead <- stream() }()
			time.Sleep(300 * time.Millisecond) // most likely granted first: the next one waits
			two := []answer{stream(), <-ahead}
			committedOne := false
			for _, a := range two {
				require.Contains(t, []int{http.StatusBadGateway, http.StatusOK, status}, a.status, "the backend is down")
				if a.status == http.StatusOK {
					committedOne = true
					if a.as {
						failed++
					}
				}
			}
			require.True(t, committedOne, "the keepalive committed the stream waiting behind the other")
		} else {
			a := stream()
			require.Contains(t, []int{http.StatusBadGateway, status}, a.status, "the backend is down")
			if a.as {
				failed++
			}
		}
		require.Greater(t, time.Since(start), 300*time.Millisecond, "reverse_proxy tried for longer than the target (lb_try_duration)")
		time.Sleep(200 * time.Millisecond) // past the interval: the next one reports
	}

	ln, err := net.Listen("tcp", backend) // the backend comes up
	require.NoError(t, err)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/health" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	up.Listener.Close()
	up.Listener = ln
	up.Start()
	t.Cleanup(up.Close)
	// Until a stream gets through (its health check passes).
	deadline := time.Now().Add(10 * time.Second)
	for stream().status != http.StatusOK {
		require.True(t, time.Now().Before(deadline), "the backend never served once up")
		time.Sleep(200 * time.Millisecond)
	}
	var share *float64
	require.Eventually(t, func() bool { share = reportedShare(t, name); return share != nil }, 10*time.Second, 20*time.Millisecond,
		"the stream the backend answered in time was never reported")
	assert.Equal(t, 1.0, *share, "streams that never reached the backend counted (above the target, or as refused)")
}
