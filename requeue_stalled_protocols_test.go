package caddyfairqueue

import (
	"context"
	"encoding/json"
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

// A stream the keepalive committed while it waited, whose upstream then
// refuses it (requeue_on) and stalls the refusal's body, ends at
// max_wait with the timeout reject's SSE error event as docs/clients.md
// shows it (nothing of the refusal before it), over each protocol.
func TestAStalledRefusalOfACommittedStreamEndsInTheTimeoutEventOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			release := make(chan struct{})
			var calls atomic.Int32
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if calls.Add(1) == 1 { // holds the permit while the stream waits
					time.Sleep(500 * time.Millisecond)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"error":`)
				_ = http.NewResponseController(w).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { close(release) })
			s := runTLSCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-stalled-%s","upstreams":[{"dial":%q,"permits":1}],
					"requeue_on":[503],"upstream_cooldown":"100ms","max_wait":"1s","sse_keepalive":"100ms"}`,
					proto, strings.TrimPrefix(upstream.URL, "http://")),
				`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
			c := s.client(t, proto)
			first := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			start := time.Now()
			resp := openStream(t, context.Background(), c, s.url)
			assert.Equal(t, proto[1:], fmt.Sprint(resp.ProtoMajor))
			ch := events(resp.Body)
			assert.True(t, strings.HasPrefix(nextEvent(t, ch), ": queued"))
			blocks := rest(t, ch)
			took := time.Since(start)
			require.NotEmpty(t, blocks)
			for _, b := range blocks[:len(blocks)-1] {
				assert.True(t, strings.HasPrefix(b, ":"), "only comments before the reject's event: %q", b)
			}
			last := blocks[len(blocks)-1]
			data, ok := strings.CutPrefix(last, "event: error\ndata: ")
			require.True(t, ok, "the last block is not the reject's error event: %q", last)
			var ev struct {
				Error struct{ Message, Type, Code string }
			}
			require.NoError(t, json.Unmarshal([]byte(data), &ev), data)
			assert.Equal(t, "rate_limit_exceeded", ev.Error.Type, data)
			assert.Equal(t, "timeout", ev.Error.Code, data)
			assert.True(t, strings.HasPrefix(ev.Error.Message, "The server is busy: "), data)
			assert.Less(t, took, 6*time.Second, "ended %v after the request (max_wait 1s)", took)
			assert.Equal(t, http.StatusOK, got(t, first).status)
		})
	}
}
