package caddyfairqueue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Site 1 names its queue from the request in the local store (r0, 1
// permit), site 2 names the same queue, "sPOST", in Redis (r2, 1
// permit). A reload that changes only a max_wait drops site 1's
// reference to its queue (the new config's handler takes one at its
// first request), and the queue, retired, still ran site 1's holder:
// site 2's queue counted it as the running request of a queue moved to
// its store, and its request, its queue idle and r2 free, waited until
// the holder ended (and a waiter of site 1 would have moved into site
// 2's queue). A handler of the config in force names the queue from the
// request in site 1's store: it did not move, and site 2's queue counts
// none of it.
func TestAReloadLeavesASiteNamingItsQueueFromTheRequestApartFromAnotherSitesQueueOfTheName(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r2 := newGateUpstream(t, true), newGateUpstream(t, false)
	port, port2 := freePort(t), freePort(t)
	server := func(server, name string, port, maxWait int, redis string, u *gateUpstream) string {
		fq := fmt.Sprintf(`{"handler":"fair_queue","name":%q,"max_wait":"%ds","permits":1%s}`, name, maxWait, redis)
		rp := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, u.dial())
		return fmt.Sprintf(`%q:{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s,%s]}]}`, server, port, fq, rp)
	}
	config := func(maxWait int) string {
		return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{%s,%s}}}}`, server("s", "s{http.request.method}", port, maxWait, "", r0),
			server("s2", "sPOST", port2, maxWait, fmt.Sprintf(`,"redis":{"addresses":[%q]}`, rds.Addr()), r2))
	}
	require.NoError(t, caddy.Load([]byte(config(60)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on r0")

	reload(t, config(59))
	site2 := postSP(context.Background(), port2)
	select {
	case code := <-site2:
		assert.Equal(t, 200, code, "site 2's request")
	case <-time.After(10 * time.Second):
		t.Errorf("site 2's request (its queue idle, r2 free) not answered while site 1's old holder runs")
		r0.release <- struct{}{} // the holder ends
		allAnswered(t, map[string]<-chan int{"site 2's request": site2})
	}
	r0.release <- struct{}{} // the holder ends (if it still runs)
	allAnswered(t, map[string]<-chan int{"the holder": holder})
	assert.EqualValues(t, 1, r0.arrivals.Load(), "arrivals at r0")
	assert.EqualValues(t, 1, r2.arrivals.Load(), "arrivals at r2")
}

// A request of site 1's first config (its queue named from the request,
// "sPOST", in the local store, r0, 1 permit, which a holder runs)
// reaches its handler after a reload that added site 2 (queue "sPOST"
// in Redis, r2): it waited in site 2's queue, for site 2's first
// request, and, granted there, ran on r0 beside the holder. It waits in
// site 1's queue, which a handler of the config in force names alike,
// and runs on r0 once the holder ends; site 2's queue serves meanwhile.
func TestALateRequestOfASiteNamingItsQueueFromTheRequestStaysInItsQueueWhenAReloadAddsASite(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r2 := newGateUpstream(t, true), newGateUpstream(t, false)
	port, port2 := freePort(t), freePort(t)
	site := func(server, name string, port int, redis string, u *gateUpstream) string {
		fq := fmt.Sprintf(`{"handler":"fair_queue","name":%q,"max_wait":"1m","permits":1%s}`, name, redis)
		rp := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, u.dial())
		return fmt.Sprintf(`%q:{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s,%s]}]}`, server, port, fq, rp)
	}
	config := func(servers string) string {
		return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{%s}}}}`, servers)
	}
	site1 := site("s", "s{http.request.method}", port, "", r0)
	holder, late := lateAcrossAReload(t, port, config(site1),
		config(site1+","+site("s2", "sPOST", port2, fmt.Sprintf(`,"redis":{"addresses":[%q]}`, rds.Addr()), r2)), r0)

	site2 := postSP(context.Background(), port2)
	select {
	case code := <-site2:
		assert.Equal(t, 200, code, "site 2's request")
	case <-time.After(10 * time.Second):
		t.Errorf("site 2's request (its queue idle, r2 free) not answered while site 1's requests run and wait")
		r0.release <- struct{}{} // the holder ends
		r0.release <- struct{}{} // the late request
		allAnswered(t, map[string]<-chan int{"site 2's request": site2})
	}
	time.Sleep(500 * time.Millisecond) // time for the late request to be granted and reach an upstream
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once: the late request ran beside the holder")
	r0.release <- struct{}{} // the holder ends
	r0.release <- struct{}{} // the late request
	allAnswered(t, map[string]<-chan int{"the late request": late, "the holder": holder})
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
	assert.EqualValues(t, 2, r0.arrivals.Load(), "arrivals at r0 (the holder and the late request)")
	assert.EqualValues(t, 1, r2.arrivals.Load(), "arrivals at r2 (site 2's request only)")
}
