package caddyfairqueue

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A waiter of a Redis config (static r0, 1 permit) is moved out by the
// first request of a local-store config, and before it finds the queue
// to wait on in, a third config brings the queue back to the same Redis
// with a pool (r1, r2), loaded and serving nothing yet. The waiter must
// never run on r0 beside the holder still there: a grant of the pool
// (naming r1 or r2) has no route of its shape in force until the third
// config serves, and the waiter's own static route would send it to r0.
// It now waits for the third config to serve (the queue's route known),
// then waits on in its queue. Before, it waited on in the queue at once,
// was granted under the pool's settings, and ran on r0 beside the holder.
func TestAWaiterMovedOutAsAReloadBringsTheQueueBackWithAPoolKeepsR0WithinItsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r1, r2 := newGateUpstream(t, true), newGateUpstream(t, false), newGateUpstream(t, false)
	port := freePort(t)

	require.NoError(t, caddy.Load([]byte(storePoolConfig(port, rds.Addr(), 1, r0, nil)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on r0")
	waiter := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return spWaiting(true) == 1 }, 10*time.Second, 5*time.Millisecond, "the waiter")

	entered, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	movedOut = func(*engine) {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	t.Cleanup(func() { movedOut = func(*engine) {} })
	defer released.Do(func() { close(release) })

	reload(t, storePoolConfig(port, "", 1, r0, nil))
	// The second config serves: its request moves the waiter out of
	// Redis, waits behind the holder in the local store, then leaves.
	ctx, cancel := context.WithCancel(context.Background())
	mover := postSP(ctx, port)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not moved out of the Redis queue")
	}
	require.Eventually(t, func() bool { return spWaiting(false) == 1 }, 10*time.Second, 5*time.Millisecond, "the second config's request")
	cancel()
	<-mover
	require.Eventually(t, func() bool { return spWaiting(false) == 0 }, 10*time.Second, 5*time.Millisecond, "the second config's request left")

	reload(t, storePoolConfig(port, rds.Addr(), 0, nil, map[*gateUpstream]int{r1: 2, r2: 1}))
	awaiting := make(chan struct{})
	var awaited sync.Once
	awaitsRoute = func(*engine) { awaited.Do(func() { close(awaiting) }) }
	t.Cleanup(func() { awaitsRoute = func(*engine) {} })
	released.Do(func() { close(release) })
	// The waiter waits for the third config to serve, waits in Redis, is
	// answered, or runs somewhere.
	require.Eventually(t, func() bool {
		select {
		case <-awaiting:
			return true
		default:
		}
		return spWaiting(true) == 1 || r0.arrivals.Load() == 2 || r1.arrivals.Load()+r2.arrivals.Load() == 1 || len(waiter) == 1
	}, 10*time.Second, 5*time.Millisecond, "the waiter went nowhere")
	r0.release <- struct{}{}                    // the holder ends
	third := postSP(context.Background(), port) // the third config serves
	select {
	case code := <-third:
		assert.Equal(t, http.StatusOK, code, "the third config's request")
	case <-time.After(30 * time.Second):
		t.Fatal("the third config's request not answered")
	}
	r0.release <- struct{}{} // the waiter, should it run on r0, is not held there
	for name, ch := range map[string]<-chan int{"the holder": holder, "the waiter": waiter} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not answered", name)
		}
	}
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
}
