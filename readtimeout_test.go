package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A server with a read_timeout (Caddyfile: timeouts { read_body }) bounds
// the reading of a request, not its life: a request that waits in the
// queue, or runs upstream, longer than that is still served, over each
// protocol. Over HTTP/1.1 the connection's read deadline, once the body
// is read, is the one Go's server watches the connection with for a
// client that leaves: the read_timeout ceiling set there again after the
// body cancelled the request as if its client had gone (the waiter
// answered with an empty 200, the running request with 499).
func TestARequestOutlivesTheServersReadTimeoutOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "read-timeout-" + proto
			s := runTLSCaddyWith(t, `"read_timeout":"500ms",`,
				fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy())
			c := s.client(t, proto)
			running := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			waiting := chat(context.Background(), c, s.url, `{"model":"m"}`)
			waitQueueWaiting(t, name, 1)

			time.Sleep(1500 * time.Millisecond) // past the read_timeout of both
			assert.Equal(t, 1, queueWaiting(t, name), "the waiter left the queue")
			assert.Equal(t, int32(1), up.run.Load(), "the running request ended")
			up.release <- struct{}{}
			up.release <- struct{}{}
			for _, ch := range []<-chan answer{running, waiting} {
				a := got(t, ch)
				require.NoError(t, a.err)
				assert.Equal(t, http.StatusOK, a.status)
				assert.Contains(t, a.body, "choices")
			}
			assert.Equal(t, int32(2), up.total.Load())
		})
	}
}
