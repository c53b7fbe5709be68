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

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A live queue counts the running requests of its namesakes in other
// stores that are retired or that no config using it uses (the config a
// reload replaces, for the moment both serve); not those of another one
// its config uses (two sites of one config), nor those of its own store
// (the store counts them). A retired one counts them alike: its
// releases still hand permits on in its store.
func TestNamesakesCountAcrossAStoreSwitchOnly(t *testing.T) {
	load, oldLoad := make(chan struct{}), make(chan struct{})
	engine := func(data string, running int64, retired bool, loads ...chan struct{}) *engine {
		e := &engine{name: "ns-test", data: data}
		e.running.Store(running)
		e.tokens.Store(running * 100) // their KV-cache tokens
		namesakes.add(e)
		for _, l := range loads {
			namesakes.use(e, l)
		}
		e.retiredFlag.Store(retired)
		t.Cleanup(func() { namesakes.remove(e) })
		return e
	}
	split := namesakes.split.Load()
	old := engine("local", 3, true)
	assert.Equal(t, split, namesakes.split.Load(), "one store: the fast path holds")
	cur := engine("redis-a", 1, false, load)
	assert.Equal(t, split+1, namesakes.split.Load())
	other := engine("redis-b", 5, false, load)
	sameData := engine("redis-a", 7, true)
	replaced := engine("redis-c", 11, false, oldLoad)
	assert.Equal(t, 3+11, cur.reserved())
	assert.Equal(t, 3+7+11, other.reserved())
	assert.Equal(t, 3+1+5+7, replaced.reserved(), "the old config's queue counts the new one's too")
	assert.Equal(t, 1+5+7+11, old.reserved(), "a retired one counts the others too: its releases hand permits on")
	assert.Equal(t, 3+5+11, sameData.reserved())
	assert.Equal(t, 1400, cur.reservedTokens(), "their tokens, alike")
	assert.Equal(t, 2100, other.reservedTokens())
	assert.Equal(t, 2400, old.reservedTokens())
	assert.Same(t, replaced, namesakes.successor(old), "the newest live one of other data")
	assert.Same(t, replaced, namesakes.successor(sameData))
	assert.Nil(t, namesakes.successor(cur), "a live queue has none")

	doneR := replaced.waits.add(nil) // it may grant at any moment
	assert.Equal(t, allReserved, cur.reserved(), "everything, while the other may grant")
	assert.Equal(t, allReserved, cur.reservedTokens())
	doneR()
	doneC := cur.waits.add(nil) // both wait: the one whose waiters came first grants
	doneR = replaced.waits.add(nil)
	assert.Equal(t, 3+11, cur.reserved(), "its waiters came first: it grants")
	assert.Equal(t, allReserved, replaced.reserved(), "the other waits for it")
	doneC2 := cur.waits.add(nil)
	doneC() // its first waiter leaves; the second's grant may be on its way
	assert.Equal(t, 3+11, cur.reserved(), "still its turn")
	assert.Equal(t, allReserved, replaced.reserved(), "not the other's while it has a waiter")
	doneC2()
	assert.Equal(t, 3+1+5+7, replaced.reserved(), "none waits there: the other's turn")
	assert.Equal(t, allReserved, cur.reserved())
	doneR()
	namesakes.use(replaced, load) // the new config uses it too
	assert.Equal(t, 3, cur.reserved(), "one config's queues count each other no more")
	namesakes.unuse(replaced, load)
	namesakes.unuse(replaced, oldLoad)
	assert.Equal(t, 3+11, cur.reserved(), "nor a queue no config uses")
	namesakes.remove(old)
	namesakes.remove(replaced)
	assert.Zero(t, cur.reserved(), "a closed engine counts no more")
	assert.Zero(t, cur.reservedTokens())
	namesakes.remove(other)
	namesakes.remove(sameData)
	assert.Equal(t, split, namesakes.split.Load(), "one store left")
}

// A queue whose waiters move answers them, and later ones, at once, and
// acquire reads that as "moved" only while the queue is marked so.
func TestMovedQueueAnswersItsWaiters(t *testing.T) {
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{Name: "moved", Permits: 1, MaxWait: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	e := &engine{name: "moved", q: q}
	held, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer held.Release()
	waiting := make(chan error, 1)
	go func() {
		_, err := q.Acquire(context.Background(), fairqueue.Request{})
		waiting <- err
	}()
	require.Eventually(t, func() bool { return q.Stats().Waiting == 1 }, 5*time.Second, 5*time.Millisecond)
	e.move()
	assert.ErrorIs(t, <-waiting, fairqueue.ErrShuttingDown)
	assert.True(t, e.moved.Load())
	_, err = q.Acquire(context.Background(), fairqueue.Request{})
	assert.ErrorIs(t, err, fairqueue.ErrShuttingDown, "a later waiter too")
}

// A reload starts the new config before it cleans up the old one: for a
// moment both serve, and the old queue is not retired yet. A queue the
// new config moved to another store counts the old queue's running
// requests from the start, not only once the old config is cleaned up.
func TestANewConfigCountsTheOldStoresRunningRequestsBeforeTheOldIsCleanedUp(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	old := provision(t, newContext(t), rds.Addr(), &Handler{Name: "ns-window", Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	next, later := newHolder(), newHolder()
	var released sync.Once
	release := func() { released.Do(func() { close(next.release) }) }
	t.Cleanup(release) // before poolEmpty: a failed test lets its requests end
	t.Cleanup(func() { close(later.release) })
	running := newRequest(context.Background(), `{}`).start(old, next)
	next.waitEntered(t)

	// The new config, in force beside the old one (not cleaned up yet).
	cur := provisionLocal(t, newContext(t), &Handler{Name: "ns-window", Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	waiting := newRequest(context.Background(), `{}`).start(cur, later)
	waitingIn(t, cur, 1)
	assert.Zero(t, later.count.Load(), "the new queue ran a request beside the old one's, above its 1 permit")

	release()
	running.wait(t)
	later.waitEntered(t)
	later.release <- struct{}{}
	waiting.wait(t)
	assert.Equal(t, http.StatusOK, waiting.w.Code)
}

// The old store's queue grants a waiter a moment before the grant reaches
// its request (a store's grant travels back to the node): a queue in
// another store for the config in force must not count the old queue's
// running requests as one fewer meanwhile. It grants nothing while the
// old queue has requests waiting, whether the old config is still in
// force (a reload's first moment) or cleaned up.
func TestANewConfigGrantsNothingWhileTheOldStoresQueueMayStillGrant(t *testing.T) {
	for _, cleaned := range []bool{false, true} {
		t.Run(map[bool]string{false: "both configs serve", true: "old config cleaned up"}[cleaned], func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			settings := func() *Handler {
				return &Handler{Name: "ns-grant-race", Permits: 1, MaxWait: caddy.Duration(time.Minute)}
			}
			old := provision(t, newContext(t), rds.Addr(), settings())
			first, second, third := newHolder(), newHolder(), newHolder()
			for _, h := range []*holder{first, second, third} {
				t.Cleanup(func() { close(h.release) })
			}
			a := newRequest(context.Background(), `{}`).start(old, first)
			first.waitEntered(t)
			b := newRequest(context.Background(), `{}`).start(old, second)
			waitingIn(t, old, 1)
			oldEngine := engineOf(t, old)

			cur := provisionLocal(t, newContext(t), settings())
			arrived, hold := make(chan struct{}), make(chan struct{})
			var held sync.Once
			unhold := func() { held.Do(func() { close(hold) }) }
			t.Cleanup(unhold)
			grantArrived = func(e *engine) {
				if e == oldEngine {
					close(arrived)
					<-hold
				}
			}
			t.Cleanup(func() { grantArrived = func(*engine) {} })

			first.release <- struct{}{} // the old queue grants b
			a.wait(t)
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the old queue's waiter was not granted")
			}
			if cleaned {
				require.NoError(t, old.Cleanup())
			}
			c := newRequest(context.Background(), `{}`).start(cur, third)
			waitingIn(t, cur, 1)
			time.Sleep(300 * time.Millisecond) // the new queue reconciles meanwhile
			assert.Zero(t, third.count.Load(), "the new queue granted beside the old one's grant")

			unhold()
			// b runs on its own route, or, once its config is cleaned up,
			// on the route of the config in force (granted under no more
			// permits than that route's).
			run := map[bool]*holder{false: second, true: third}[cleaned]
			run.waitEntered(t)
			assert.Equal(t, int32(1), second.count.Load()+third.count.Load(), "the new queue granted beside the old one's request")
			run.release <- struct{}{}
			b.wait(t)
			third.waitEntered(t)
			third.release <- struct{}{}
			c.wait(t)
			assert.Equal(t, http.StatusOK, c.w.Code)
		})
	}
}

// A queue retired by a reload and still open (its last request runs)
// shares its store with a newer queue of the same name and store (a
// reload back to that store): its release hands the freed permit on in
// that store, and must do it under the settings in force and counting
// the requests still running in another store, not under its old
// permits alone.
func TestARetiredQueueHandsOnUnderTheSettingsInForce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	in := func(prefix string, permits int) *Handler {
		return &Handler{Name: "ns-stale", Permits: permits, MaxWait: caddy.Duration(time.Minute),
			Redis: &RedisConfig{Addresses: []string{rds.Addr()}, KeyPrefix: prefix}}
	}
	first, up := newHolder(), newHolder() // r0's upstream; the others'
	for _, h := range []*holder{first, up} {
		t.Cleanup(func() { close(h.release) })
	}
	// Config 1: store "two", 2 permits; r0 runs.
	hA := provision(t, newContext(t), "", in("two", 2))
	r0 := newRequest(context.Background(), `{}`).start(hA, first)
	first.waitEntered(t)
	// Config 2: store "one", 2 permits; config 1 cleaned up. r1 runs
	// beside r0; r2 waits.
	hB := provision(t, newContext(t), "", in("one", 2))
	require.NoError(t, hA.Cleanup())
	r1 := newRequest(context.Background(), `{}`).start(hB, up)
	up.waitEntered(t)
	r2 := newRequest(context.Background(), `{}`).start(hB, up)
	waitingIn(t, hB, 1)
	// Config 3: back to store "two", 1 permit; config 2 cleaned up. r3
	// comes; r2 moves to store "two". Config 1's queue there, retired, is
	// still open: r0 runs.
	hC := provision(t, newContext(t), "", in("two", 1))
	require.NoError(t, hB.Cleanup())
	r3 := newRequest(context.Background(), `{}`).start(hC, up)
	waitingIn(t, hC, 2)

	// r0 ends: config 1's queue releases its permit in store "two". r1
	// still runs, and config 3 allows 1: nobody starts.
	first.release <- struct{}{}
	r0.wait(t)
	time.Sleep(300 * time.Millisecond) // the queues reconcile meanwhile
	assert.Equal(t, int32(1), up.count.Load(), "a request started beside r1, above config 3's 1 permit")

	up.release <- struct{}{} // r1 ends: r2 and r3 run, one after the other
	r1.wait(t)
	up.waitEntered(t)
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, int32(2), up.count.Load(), "two at once, above config 3's 1 permit")
	up.release <- struct{}{}
	up.waitEntered(t)
	up.release <- struct{}{}
	r2.wait(t)
	r3.wait(t)
	assert.Equal(t, http.StatusOK, r2.w.Code)
	assert.Equal(t, http.StatusOK, r3.w.Code)
}

// A retired queue's waiters move to the live namesake that serves (its
// route is known), not to a newer one of a config still being loaded.
func TestSuccessorIsTheLiveNamesakeThatServes(t *testing.T) {
	engine := func(data string, retired bool) *engine {
		e := &engine{name: "ns-successor", data: data}
		namesakes.add(e)
		e.retiredFlag.Store(retired)
		t.Cleanup(func() { namesakes.remove(e) })
		return e
	}
	old := engine("a", true)
	serving := engine("b", false)
	serving.routes.plain.Store(&route{})
	loading := engine("c", false)
	assert.Same(t, serving, namesakes.successor(old))
	namesakes.remove(serving)
	assert.Same(t, loading, namesakes.successor(old), "none serves yet: the newest")
}

// A reload that changes only a Redis client option (a timeout) opens a
// new queue on the same data beside the old one; the old one, retired
// once the new one serves, takes the new settings: its releases hand
// permits on in the same queue.
func TestARetiredQueueOfTheSameDataTakesTheSettingsInForce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	in := func(permits int, read time.Duration) *Handler {
		return &Handler{Name: "ns-same-data", Permits: permits, MaxWait: caddy.Duration(time.Minute),
			Redis: &RedisConfig{Addresses: []string{rds.Addr()}, ReadTimeout: caddy.Duration(read)}}
	}
	a, b, c := newHolder(), newHolder(), newHolder()
	for _, h := range []*holder{a, b, c} {
		t.Cleanup(func() { close(h.release) })
	}
	old := provision(t, newContext(t), "", in(2, 0))
	r0 := newRequest(context.Background(), `{}`).start(old, a)
	a.waitEntered(t)
	r1 := newRequest(context.Background(), `{}`).start(old, b)
	b.waitEntered(t)

	cur := provision(t, newContext(t), "", in(1, 700*time.Millisecond))
	require.NotSame(t, engineOf(t, old), engineOf(t, cur), "another client: another queue on the same data")
	r2 := newRequest(context.Background(), `{}`).start(cur, c)
	waitingIn(t, cur, 1)
	require.NoError(t, old.Cleanup())

	a.release <- struct{}{} // r0 ends; r1 still runs, and 1 permit is in force
	r0.wait(t)
	time.Sleep(300 * time.Millisecond)
	assert.Zero(t, c.count.Load(), "r2 started beside r1, above the 1 permit in force")
	b.release <- struct{}{}
	r1.wait(t)
	c.waitEntered(t)
	c.release <- struct{}{}
	r2.wait(t)
	assert.Equal(t, http.StatusOK, r2.w.Code)
}

// Both queues of a store switch have waiters (the old config still in
// force): the one whose waiter came first grants, the other waits for
// it; neither waits for the other forever.
func TestOfTwoQueuesWithWaitersTheOneWaitingLongestGrants(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	settings := func() *Handler {
		return &Handler{Name: "ns-both-wait", Permits: 1, MaxWait: caddy.Duration(time.Minute)}
	}
	up := newHolder()
	t.Cleanup(func() { close(up.release) })
	old := provision(t, newContext(t), rds.Addr(), settings())
	a := newRequest(context.Background(), `{}`).start(old, up)
	up.waitEntered(t)
	b := newRequest(context.Background(), `{}`).start(old, up)
	waitingIn(t, old, 1)
	cur := provisionLocal(t, newContext(t), settings())
	c := newRequest(context.Background(), `{}`).start(cur, up)
	waitingIn(t, cur, 1)

	up.release <- struct{}{} // a ends: b, which came first, runs
	a.wait(t)
	up.waitEntered(t)
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, int32(2), up.count.Load(), "c ran beside b, above the 1 permit")
	up.release <- struct{}{} // b ends: c runs
	b.wait(t)
	up.waitEntered(t)
	up.release <- struct{}{}
	c.wait(t)
	assert.Equal(t, http.StatusOK, b.w.Code)
	assert.Equal(t, http.StatusOK, c.w.Code)
}

// A request of the old config whose pool upstream refuses it (requeue_on)
// after a reload moved its queue to another store waits again like any
// other waiter of the moved queue: in the queue of the config in force.
// It is not answered shutting_down: the server is not shutting down.
func TestRequeueAfterAReloadMovedTheQueueWaitsInTheNewStore(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	settings := func() *Handler {
		return &Handler{Name: "mv-requeue", Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2}},
			RequeueOn: []int{503}, MaxWait: caddy.Duration(10 * time.Second)}
	}
	old := provisionLocal(t, newContext(t), settings())
	entered, refuseNow := make(chan struct{}, 1), make(chan struct{})
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		if call == 1 {
			entered <- struct{}{}
			<-refuseNow
			return refuse(w, http.StatusServiceUnavailable, "")
		}
		return answerOK(w)
	}}
	req := poolRequest(context.Background()).start(old, next)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("not forwarded")
	}

	// The reload: the new config keeps the queue in Redis, serves, and the
	// old config is cleaned up (its queue retires and moves).
	curSettings := settings()
	cur := provision(t, newContext(t), rds.Addr(), curSettings)
	first := poolRequest(context.Background()).start(cur, &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error { return answerOK(w) }}).wait(t)
	require.Equal(t, http.StatusOK, first.w.Code)
	require.NoError(t, old.Cleanup())

	close(refuseNow) // the old config's upstream refuses: the request waits again
	req.wait(t)
	assert.Equal(t, http.StatusOK, req.w.Code, "reason %q, body %s", req.w.Header().Get("Fair-Queue-Reason"), req.w.Body.String())
	assert.Len(t, next.calls, 2, "sent again once granted in the queue in force")
}
