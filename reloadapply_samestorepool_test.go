package caddyfairqueue

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// sameStorePoolConfig is storePoolConfig in Redis at addr, with the
// client's dial_timeout set to dial where it is not "": another client
// of the same data, so another queue (engine) of the same store.
func sameStorePoolConfig(port int, addr, dial string, permits int, static *gateUpstream, pool map[*gateUpstream]int) string {
	cfg := storePoolConfig(port, addr, permits, static, pool)
	if dial == "" {
		return cfg
	}
	return strings.Replace(cfg, fmt.Sprintf(`"addresses":[%q]`, addr), fmt.Sprintf(`"addresses":[%q],"dial_timeout":%q`, addr, dial), 1)
}

// A waiter of a Redis config (static r0, 1 permit) stays in its queue
// when the next config (static r2, 1 permit) uses the same Redis
// through another client (another dial_timeout): the old queue, retired,
// takes the new one's settings, and its holder's release grants the
// waiter under them. The grant reaches the waiter only once a third
// config (a pool of r1 and r2, the second config's client) has served:
// it takes the second config's route (r2), the one of the plain
// settings it was made under, recorded on the second config's queue,
// never the waiter's own (r0), which no config since the first lets run
// anything.
func TestAGrantMadeUnderASameStoreNamesakesSettingsTakesTheirRouteAfterAReloadToAPool(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r1, r2 := newGateUpstream(t, true), newGateUpstream(t, false), newGateUpstream(t, false)
	port := freePort(t)

	require.NoError(t, caddy.Load([]byte(sameStorePoolConfig(port, rds.Addr(), "", 1, r0, nil)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on r0")
	waiter := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return spWaiting(true) == 1 }, 10*time.Second, 5*time.Millisecond, "the waiter")

	// The first grant (the waiter's) is held before it reaches the
	// request.
	held, release := holdFirstRemoteGrant(t)

	reload(t, sameStorePoolConfig(port, rds.Addr(), "4s", 1, r2, nil))
	// The second config serves (its settings apply, and the retired
	// queue takes them); its request waits behind the holder, then
	// leaves.
	ctx, cancel := context.WithCancel(context.Background())
	second := postSP(ctx, port)
	require.Eventually(t, func() bool { return spWaiting(true) == 2 }, 10*time.Second, 5*time.Millisecond,
		"the second config's request and the waiter")
	cancel()
	<-second
	require.Eventually(t, func() bool { return spWaiting(true) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the waiter alone")

	r0.release <- struct{}{} // the holder ends: its release grants the waiter under the second config's settings
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted")
	}
	reload(t, sameStorePoolConfig(port, rds.Addr(), "4s", 0, nil, map[*gateUpstream]int{r1: 2, r2: 1}))
	servedUnderThePool(t, port, release, holder, waiter, r0, r1, r2)
}
