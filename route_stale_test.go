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
// reloads. The second config points the route at B with 2 permits and
// serves, so its settings and route are in force; the third gives the
// queue a pool and has served nothing yet, so the second config's
// settings stay in force after its cleanup. A grant under them (2
// permits, counted for B) must still go to B, the route of the config
// whose settings made it, not to the waiter's own A, which had 1 permit
// and still runs the first config's holder.
func TestAGrantUnderTheSettingsOfACleanedUpConfigTakesThatConfigsRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b, c := newPeakUpstream(t), newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	onA, waiters := holdAndQueue(t, port, olderConfig(port, 1, a), a, 2)

	reload(t, olderConfig(port, 2, b))
	onB := sendOlder(t, port, "/0", 1) // the second config serves: its route and 2 permits
	require.Eventually(t, func() bool { return b.now.Load() == 1 && olderWaiting() == 2 }, 10*time.Second,
		5*time.Millisecond, "a first waiter on B, the second and the new request waiting")

	require.NoError(t, caddy.Load([]byte(olderPoolConfig(port, 2, c)), false))
	secondWaiterKeepsA(t, a, b, c, onA, onB, waiters)
}

// As above, but the third config lowers the permits (to 2, on C): they
// apply at the second config's cleanup, before the third serves. A grant
// under them to a waiter of the first config must not go to A either:
// the second config's route (B, 3 permits) stands for the third's until
// it serves.
func TestLoweredPermitsHandedOnAtACleanupKeepTheOldRouteForOlderWaiters(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b, c := newPeakUpstream(t), newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	onA, waiters := holdAndQueue(t, port, olderConfig(port, 1, a), a, 4)

	reload(t, olderConfig(port, 3, b))
	onB := sendOlder(t, port, "/0", 1) // the second config serves: its route and 3 permits
	require.Eventually(t, func() bool { return b.now.Load() == 2 && olderWaiting() == 3 }, 10*time.Second,
		5*time.Millisecond, "two waiters on B, two and the new request waiting")

	require.NoError(t, caddy.Load([]byte(olderConfig(port, 2, c)), false))
	b.open() // the two on B end: the next grant is made under the third config's 2 permits
	require.Eventually(t, func() bool { return olderWaiting() < 3 }, 10*time.Second, 5*time.Millisecond,
		"the first config's next waiter granted")
	time.Sleep(200 * time.Millisecond) // time for a waiter granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than its 1 permit")

	a.open()
	c.open()
	assert.Equal(t, http.StatusOK, <-onA)
	assert.Equal(t, http.StatusOK, <-onB)
	for range 4 {
		assert.Equal(t, http.StatusOK, <-waiters)
	}
}

// secondWaiterKeepsA lets the one request on B end, so that the next
// grant is made under the second config's 2 permits, and checks that the
// first config's second waiter, granted then, did not run A above its 1
// permit; then it lets every request end, each answered 200 (onA and
// onB one each, waiters two).
func secondWaiterKeepsA(t *testing.T, a, b, c *peakUpstream, onA, onB, waiters <-chan int) {
	t.Helper()
	b.open() // the waiter on B ends: the next grant is made under the second config's 2 permits
	require.Eventually(t, func() bool { return olderWaiting() < 2 }, 10*time.Second, 5*time.Millisecond,
		"the first config's second waiter granted")
	time.Sleep(200 * time.Millisecond) // time for a waiter granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than its 1 permit")

	a.open()
	c.open()
	for _, ch := range []<-chan int{onA, onB, waiters, waiters} {
		assert.Equal(t, http.StatusOK, <-ch)
	}
}
