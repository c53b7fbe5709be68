package caddyfairqueue

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// sameStoreConfig is olderConfig's one route in Redis at addr, its
// client's dial timeout dial (another timeout: another client and engine
// of the same data); pooled gives the queue a pool of the upstream
// instead of a static reverse_proxy.
func sameStoreConfig(port, permits int, addr, dial string, pooled bool, u *peakUpstream) string {
	redis := fmt.Sprintf(`"redis":{"addresses":[%q],"dial_timeout":%q}`, addr, dial)
	handle := fmt.Sprintf(`{"handler":"fair_queue","name":"older","permits":%d,"max_wait":"1m",%s},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, permits, redis, u.dial())
	if pooled {
		handle = fmt.Sprintf(`{"handler":"fair_queue","name":"older","upstreams":[{"dial":%q,"permits":%d}],"max_wait":"1m",%s},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`, u.dial(), permits, redis)
	}
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"match":[{"path":["/0"]}],"handle":[%s]}]}}}}}`,
		port, handle)
}

// As TestAGrantUnderTheSettingsOfACleanedUpConfigTakesThatConfigsRoute,
// but the second config reaches the same Redis through another client
// (another dial timeout): the first config's queue is retired, its
// waiters wait on in it, and it takes the second config's settings
// (adopt). Once the third config (a pool) replaced the second before
// serving, a grant to such a waiter under the second config's 2 permits
// must still go to B, not to the waiter's own A, which had 1 permit and
// still runs the first config's holder.
func TestARetiredQueueOfTheSameStoreGrantsUnderAdoptedSettingsOnTheirRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	a, b, c := newPeakUpstream(t), newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	onA, waiters := holdAndQueue(t, port, sameStoreConfig(port, 1, rds.Addr(), "1s", false, a), a, 2)

	reload(t, sameStoreConfig(port, 2, rds.Addr(), "2s", false, b))
	onB := sendOlder(t, port, "/0", 1) // the second config serves: its route and 2 permits
	require.Eventually(t, func() bool { return b.now.Load() == 1 && olderWaiting() == 2 }, 10*time.Second,
		5*time.Millisecond, "a first waiter on B, the second and the new request waiting")

	require.NoError(t, caddy.Load([]byte(sameStoreConfig(port, 2, rds.Addr(), "2s", true, c)), false))
	secondWaiterKeepsA(t, a, b, c, onA, onB, waiters)
}
