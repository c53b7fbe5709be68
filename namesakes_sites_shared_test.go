package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Sites A (r0) and B (r2) both name their queue from the request in the
// local store: one queue "sPOST", 1 permit, a holder of A on r0. A
// reload moves A's queue to Redis (still r0); B stays. A's new queue
// must count A's holder, which runs on r0.
func TestOneSiteOfTwoSharingAQueueNamedFromTheRequestMovesOutWithinItsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r2 := newGateUpstream(t, true), newGateUpstream(t, false)
	port, port2 := freePort(t), freePort(t)
	server := func(server string, port int, redis bool, u *gateUpstream) string {
		r := ""
		if redis {
			r = redisAt(rds, "")
		}
		return siteServer(server, port, "s{http.request.method}", "1m", 1, r, u)
	}
	require.NoError(t, caddy.Load([]byte(serversConfig(server("s", port, false, r0)+","+server("s2", port2, false, r2))), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := holderOn(t, port, r0)

	reload(t, serversConfig(server("s", port, true, r0)+","+server("s2", port2, false, r2)))
	site1 := postSP(context.Background(), port)
	time.Sleep(time.Second)
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
	r0.release <- struct{}{}
	r0.release <- struct{}{}
	allAnswered(t, map[string]<-chan int{"the holder": holder, "site 1's new request": site1})
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
}

// Site 1 names its queue from the request ("sPOST", in the local store,
// r0, 1 permit, which a holder runs): a reload moves site 1's queue to
// Redis (still r0) and adds site 2 naming its queue from the request in
// the local store (r2). Site 1's new queue must count the holder, which
// runs on r0: the old queue moved, whichever handler names its name in
// its store since.
func TestASiteMovedOutBesideASiteAddedInItsStoreKeepsItsUpstreamWithinItsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r2 := newGateUpstream(t, true), newGateUpstream(t, false)
	port, port2 := freePort(t), freePort(t)
	server := func(server string, port int, redis bool, u *gateUpstream) string {
		r := ""
		if redis {
			r = redisAt(rds, "")
		}
		return siteServer(server, port, "s{http.request.method}", "1m", 1, r, u)
	}
	require.NoError(t, caddy.Load([]byte(serversConfig(server("s", port, false, r0))), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := holderOn(t, port, r0)

	reload(t, serversConfig(server("s", port, true, r0)+","+server("s2", port2, false, r2)))
	site1 := postSP(context.Background(), port)
	time.Sleep(time.Second)
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
	r0.release <- struct{}{}
	r0.release <- struct{}{}
	allAnswered(t, map[string]<-chan int{"the holder": holder, "site 1's new request": site1})
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
}
