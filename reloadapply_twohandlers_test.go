package caddyfairqueue

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiter of the first config (1 permit, upstream A) outlives two
// reloads. The second points the route at B with the same permit: its
// settings are handed on at the first config's cleanup, with the first
// config's route standing for its own, and it serves nothing. The third
// names the queue in two handlers, both to B, with 3 permits. What
// follows the second config's handler and the third's is alike, but the
// second's route never served: the first config's waiters, which keep
// their own route under a config with two handlers of the queue, run on
// A. The 3 permits must not be handed on before the third config serves
// (docs/operations.md: the old route did not serve the queue last), and
// A must not run three at once.
func TestHandingOnMorePermitsToTwoHandlersKeepsTheWaitersOfAnOlderConfigWithinTheirUpstreamsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b := newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	onA, waiters := holdAndQueue(t, port, olderConfig(port, 1, a), a, 3)

	require.NoError(t, caddy.Load([]byte(olderConfig(port, 1, b)), false))
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 3, b, b)), false))
	time.Sleep(500 * time.Millisecond) // time for waiters granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than its 1 permit")

	a.open()
	b.open()
	assert.Equal(t, http.StatusOK, <-onA)
	for range 3 {
		assert.Equal(t, http.StatusOK, <-waiters)
	}
}

// As above, but the second config serves the queue (its route, B, is
// the last recorded) before the third loads: the third's 3 permits are
// handed on at the second's cleanup, where what follows both is alike.
// The first config's waiters still wait, on their own route to A, which
// they keep under a config with two handlers of the queue: A must not
// run three of them at once for a hand-on that no request of the third
// config made.
func TestHandingOnMorePermitsToTwoHandlersKeepsTheWaitersOfAConfigBeforeTheLastToServeWithinTheirUpstreamsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b := newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	onA, waiters := holdAndQueue(t, port, olderConfig(port, 1, a), a, 3)

	reload(t, olderConfig(port, 1, b))
	onB := sendOlder(t, port, "/0", 1) // the second config serves: its route, B
	require.Eventually(t, func() bool { return olderWaiting() == 4 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 3, b, b)), false))
	time.Sleep(500 * time.Millisecond) // time for waiters granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than its 1 permit")

	a.open()
	b.open()
	assert.Equal(t, http.StatusOK, <-onA)
	assert.Equal(t, http.StatusOK, <-onB)
	for range 3 {
		assert.Equal(t, http.StatusOK, <-waiters)
	}
}
