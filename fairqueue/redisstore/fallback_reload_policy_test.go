package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request that comes as Redis goes away waits for its turn into the
// fallback queue behind Redis's waiters moving there. Meanwhile a reload
// sets on_store_error fail_closed, and Redis comes back: let in, the
// request waits in Redis's queue, as one that came then would, and as it
// did where the policy stayed local (the fallback queue retired, it
// waits in the store's). Answered by the policy in force with no check
// that the store was back, it was refused store_unavailable while Redis
// answered.
func TestARequestWaitingItsTurnIntoTheFallbackGoesToRedisBackAfterAReloadToFailClosed(t *testing.T) {
	m := startMovingTurn(t, "fbturnpolicy")
	srv, n, fb, holder, w1, r2 := m.srv, m.n, m.fb, m.holder, m.w1, m.r2

	// A reload sets fail_closed, and Redis comes back.
	closed := n.q.Config()
	closed.Fallback = nil
	require.NoError(t, n.q.Reconfigure(closed))
	// w1, held on its way, counts as waiting in the fallback queue while
	// the node serves from it (Stats), and no more once it retired.
	require.Equal(t, 1, n.q.Stats().Waiting, "w1 not counted waiting in the fallback queue")
	srv.Restart()
	eventually(t, 20*time.Second, func() bool { return n.q.Stats().StoreUp }, "Redis never marked up again")
	// Marked up, the node still serves from the fallback queue until the
	// heartbeat that has Redis count its permits retires it (a loop turn
	// later): a request let in before then waits there, as one that
	// comes then does, and is served there (seen under CPU load).
	eventually(t, 20*time.Second, func() bool { return n.q.Stats().Waiting == 0 }, "the fallback queue never retired")
	close(fb.lets)

	// r2 waits in Redis, behind the holder (and w1): it is served there
	// once they end.
	holder.Release()
	if p := <-w1; p != nil {
		p.Release()
	}
	var r acquired
	select {
	case r = <-r2:
	case <-time.After(20 * time.Second):
		t.Fatal("r2 was never answered")
	}
	var re *fairqueue.RejectError
	if errors.As(r.err, &re) {
		t.Fatalf("r2 was refused %s while Redis was up: answered by the fail_closed policy as if Redis were still down", re.Reason)
	}
	require.NoError(t, r.err)
	defer r.p.Release()
	assert.False(t, r.p.Local(), "r2 served by the fallback queue")
	assert.False(t, r.p.FailOpen(), "r2 admitted without Redis")
}
