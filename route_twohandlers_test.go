package caddyfairqueue

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiter of the first config (route /0, upstream A) outlives two
// reloads. The second config names the queue in two handlers, /0 to B
// and /1 to C, and only /1 serves; the third gives the queue a pool and
// has served nothing yet, so the second config's settings stay. With two
// handlers of the second config naming the queue, which one replaced
// the waiter's route cannot be told: a grant under them to the first
// config's /0 waiters must not send them to C, the upstream of the other
// path, whichever of the second config's handlers was cleaned up last;
// they run on A, their own route.
func TestAGrantUnderTheSettingsOfAConfigWithTwoHandlersOfTheQueueKeepsItsOwnRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b, c, d := newPeakUpstream(t), newPeakUpstream(t), newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	onA, waiters := holdAndQueue(t, port, olderConfig(port, 1, a), a, 2)

	reload(t, olderConfig(port, 1, b, c))
	onC := sendOlder(t, port, "/1", 1) // the second config's /1 serves: its route, C
	require.Eventually(t, func() bool { return olderWaiting() == 3 }, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, caddy.Load([]byte(olderPoolConfig(port, 1, d)), false))
	a.open() // the holder ends: the next grants, to the waiters of /0, are made under the second config's settings
	for range 2 {
		select {
		case code := <-waiters:
			assert.Equal(t, http.StatusOK, code)
		case <-time.After(10 * time.Second):
			t.Fatalf("a waiter of /0 held on C, the upstream of /1 (C runs %d)", c.now.Load())
		}
	}
	require.Eventually(t, func() bool { return c.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the second config's /1 request on C")

	b.open()
	c.open()
	d.open()
	assert.Equal(t, http.StatusOK, <-onA)
	assert.Equal(t, http.StatusOK, <-onC)
}
