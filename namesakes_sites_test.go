package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Two sites of one config may name one queue in two stores (the local
// store and Redis): two queues, apart by the operator's choice, each
// counting its own upstream (namesakes.go). A reload that adds the
// second site must leave the first site's requests in the first site's
// queue and on its route: a queue of the name in another store is a
// successor only where the config in force no longer uses the request's
// own store for it.

// sitesConfig is queue "sp" of site 1 (port, the local store, static
// u1 with p1 permits) and, where port2 is not 0, queue "sp" of site 2
// (port2, Redis at addr, static u2 with p2 permits).
func sitesConfig(port, p1 int, u1 *gateUpstream, port2 int, addr string, p2 int, u2 *gateUpstream) string {
	servers := siteServer("s", port, "sp", "1m", p1, "", u1)
	if port2 != 0 {
		servers += "," + siteServer("s2", port2, "sp", "1m", p2, fmt.Sprintf(`,"redis":{"addresses":[%q]}`, addr), u2)
	}
	return serversConfig(servers)
}

// siteServer is Caddy server server on port whose route is fair_queue
// (queue name, max_wait, permits, and store: "" the local one, else the
// handler's JSON fields for it, such as `,"redis":{...}`) before a
// static reverse_proxy to u.
func siteServer(server string, port int, name, maxWait string, permits int, store string, u *gateUpstream) string {
	fq := fmt.Sprintf(`{"handler":"fair_queue","name":%q,"max_wait":%q,"permits":%d%s}`, name, maxWait, permits, store)
	rp := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, u.dial())
	return fmt.Sprintf(`%q:{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s,%s]}]}`, server, port, fq, rp)
}

// serversConfig is a config of servers (siteServer's, comma-joined).
func serversConfig(servers string) string {
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{%s}}}}`, servers)
}

// redisAt is siteServer's store for Redis at rds, under key prefix
// prefix ("": the default one).
func redisAt(rds *redistest.Server, prefix string) string {
	if prefix == "" {
		return fmt.Sprintf(`,"redis":{"addresses":[%q]}`, rds.Addr())
	}
	return fmt.Sprintf(`,"redis":{"addresses":[%q],"key_prefix":%q}`, rds.Addr(), prefix)
}

// holderOn starts a request of the site on port and waits until it runs
// on u (a gate upstream that holds it); its status arrives on the
// channel once u lets it go.
func holderOn(t *testing.T, port int, u *gateUpstream) <-chan int {
	t.Helper()
	holder := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return u.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on its upstream")
	return holder
}

// switchingSites is site 1 (queue "sp", 1 permit, on port) whose store
// a test switches, beside site 2 (queue "sp" in Redis under key prefix
// "a", r2, 1 permit, on port2); r0 holds its requests.
type switchingSites struct {
	rds         *redistest.Server
	r0, r1, r2  *gateUpstream
	port, port2 int
}

func newSwitchingSites(t *testing.T) *switchingSites {
	return &switchingSites{rds: redistest.Start(t), r0: newGateUpstream(t, true), r1: newGateUpstream(t, false),
		r2: newGateUpstream(t, false), port: freePort(t), port2: freePort(t)}
}

// config has site 1 in the local store (prefix1 "") or in Redis under
// key prefix prefix1, before a static reverse_proxy to u1.
func (s *switchingSites) config(prefix1 string, u1 *gateUpstream) string {
	store1 := ""
	if prefix1 != "" {
		store1 = redisAt(s.rds, prefix1)
	}
	return serversConfig(siteServer("s", s.port, "sp", "1m", 1, store1, u1) + "," +
		siteServer("s2", s.port2, "sp", "1m", 1, redisAt(s.rds, "a"), s.r2))
}

// allAnswered waits for the status of each request named.
func allAnswered(t *testing.T, chs map[string]<-chan int) {
	t.Helper()
	for name, ch := range chs {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not answered", name)
		}
	}
}

// A request of site 1's first config (the local store, r0, 1 permit,
// which a holder runs) reaches its handler after a reload that added
// site 2 (queue "sp" in Redis, r2): it waited in site 2's queue (for
// site 2's first request: without one it would have been rejected at
// its max_wait while its own queue served), was granted there and ran
// on r0 beside the holder, which site 1's queue counts alone. It waits
// in site 1's queue, and runs on r0 once the holder ends.
func TestALateRequestOfASiteStaysInItsQueueWhenAReloadAddsASiteWithItsNameInAnotherStore(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r2 := newGateUpstream(t, true), newGateUpstream(t, false)
	port, port2 := freePort(t), freePort(t)
	holder, late := lateAcrossAReload(t, port, sitesConfig(port, 1, r0, 0, "", 0, nil),
		sitesConfig(port, 1, r0, port2, rds.Addr(), 1, r2), r0)

	allAnswered(t, map[string]<-chan int{"site 2's request": postSP(context.Background(), port2)})
	time.Sleep(500 * time.Millisecond) // time for the late request to be granted and reach an upstream
	assert.EqualValues(t, 1, r2.arrivals.Load(), "arrivals at r2 (site 2's request only)")
	r0.release <- struct{}{} // the holder ends
	r0.release <- struct{}{} // the late request
	allAnswered(t, map[string]<-chan int{"the late request": late, "the holder": holder})
	assert.EqualValues(t, 2, r0.arrivals.Load(), "arrivals at r0 (the holder and the late request)")
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
	assert.EqualValues(t, 1, r2.arrivals.Load(), "arrivals at r2 (site 2's request only)")
}
