package caddyfairqueue

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// moveBackConfig is queue "older" of 1 permit in front of u on path /0,
// in Redis at addr ("" the local store).
func moveBackConfig(port int, addr string, u *peakUpstream) string {
	store := ""
	if addr != "" {
		store = fmt.Sprintf(`,"redis":{"addresses":[%q]}`, addr)
	}
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"match":[{"path":["/0"]}],"handle":[
	{"handler":"fair_queue","name":"older","permits":1,"max_wait":"1m"%s},
	{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, port, store, u.dial())
}

// A reload moves queue "older" from Redis to the local store (or the
// other way) while a request holds its permit and another waits; the new config's first
// request moves the waiter out, and before it has found the local queue,
// a second reload brings the queue back to its first store (the first queue, still
// open for its holder, is retired beside the new one of its store). The
// waiter waits on in the queue in force, and is served once the holder
// ends: before, it found no queue in another store and was answered
// shutting_down.
func TestAWaiterMovedOutAsAReloadBringsTheQueueBackToItsStoreWaitsOn(t *testing.T) {
	t.Run("redis, local, redis", func(t *testing.T) { moveBack(t, true) })
	t.Run("local, redis, local", func(t *testing.T) { moveBack(t, false) })
}

// moveBack runs TestAWaiterMovedOutAsAReloadBringsTheQueueBackToItsStoreWaitsOn
// from Redis (or from the local store, through Redis).
func moveBack(t *testing.T, fromRedis bool) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	first, middle := rds.Addr(), ""
	if !fromRedis {
		first, middle = "", rds.Addr()
	}
	a := newPeakUpstream(t)
	port := freePort(t)
	onA, waiter := holdAndQueue(t, port, moveBackConfig(port, first, a), a, 1)

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	movedOut = func(*engine) {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	t.Cleanup(func() { movedOut = func(*engine) {} })

	reload(t, moveBackConfig(port, middle, a))
	served := sendOlder(t, port, "/0", 1) // the second config serves: the waiter moves out
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not moved out of its first store's queue")
	}
	reload(t, moveBackConfig(port, first, a))
	close(release)
	later := sendOlder(t, port, "/0", 1)
	a.open()
	for name, ch := range map[string]<-chan int{"the holder": onA, "the waiter": waiter, "the second config's request": served, "the last config's request": later} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not answered", name)
		}
	}
	assert.EqualValues(t, 1, a.most.Load(), "requests at the upstream at once")
}
