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

// Many streams of one connection reset while they wait, and just as
// the permit comes (the grant races the resets): none leaks or keeps
// the permit, the queue empties, the upstream never runs more than the
// permits, and the next request is served.
func TestStreamsResetAsTheyAreGrantedLeakNoPermitOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "reset-flood-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy())
			c := s.client(t, proto)
			first := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			const n = 50
			ctx, cancel := context.WithCancel(context.Background())
			var gone []<-chan answer
			for range n {
				gone = append(gone, chat(ctx, c, s.url, `{"model":"gone"}`))
			}
			waitQueueWaiting(t, name, n)
			up.release <- struct{}{} // the head is granted as the streams reset
			cancel()
			assert.Equal(t, http.StatusOK, got(t, first).status)
			for _, ch := range gone {
				got(t, ch)
			}
			waitQueueWaiting(t, name, 0)
			require.Eventually(t, func() bool { return up.run.Load() == 0 }, 10*time.Second, 5*time.Millisecond)

			last := chat(context.Background(), c, s.url, `{"model":"last"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
				"the next request never reached the upstream: a reset stream keeps the permit")
			up.release <- struct{}{}
			a := got(t, last)
			require.NoError(t, a.err)
			assert.Equal(t, http.StatusOK, a.status)
			assert.Equal(t, int32(1), up.most.Load())
		})
	}
}
