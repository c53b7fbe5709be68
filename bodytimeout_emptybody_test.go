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

// body_timeout bounds the reading of a body, not a request's wait: a
// request without a body (Content-Length: 0) that waits in the queue
// longer than body_timeout is still served when its turn comes, over
// each protocol, on a server with its access log on (Caddy then wraps
// every body, an empty one too, to count its bytes) and its read idle
// timeout off (read_idle_timeout -1, as behind a proxy that buffers
// bodies). Over HTTP/1.1 Go's server already watches such a request's
// connection for a client that leaves (a read in the background): the
// body's deadline left on the connection ended that read, and the
// request was cancelled as if its client had gone.
func TestARequestWithoutABodyOutlivesBodyTimeoutWithAnAccessLog(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "empty-body-" + proto
			s := runTLSCaddyWith(t, `"logs":{},"read_idle_timeout":"-1s",`,
				fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","body_timeout":"200ms"}`, name), up.proxy())
			c := s.client(t, proto)
			running := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			waiting := chat(context.Background(), c, s.url, "")
			waitQueueWaiting(t, name, 1)

			time.Sleep(1500 * time.Millisecond) // past the waiter's body_timeout
			assert.Equal(t, 1, queueWaiting(t, name), "the waiter left the queue")
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
