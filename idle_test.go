package caddyfairqueue

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// setQueueIdle sets the idle time of queues named from the request for
// one test.
func setQueueIdle(t *testing.T, d time.Duration) {
	t.Helper()
	old := queueIdle
	queueIdle = d
	t.Cleanup(func() { queueIdle = old })
}

// model sends one request for model through h and returns it answered.
func model(t *testing.T, h *Handler, name string) *request {
	t.Helper()
	return newRequest(context.Background(), `{"model":"`+name+`"}`).start(h, okHandler).wait(t)
}

// noEngines waits until h holds no engine and the pool has none left.
func noEngines(t *testing.T, h *Handler) {
	t.Helper()
	require.Eventually(t, func() bool {
		n := 0
		engines.Range(func(_, _ any) bool { n++; return true })
		return len(h.engineList()) == 0 && n == 0
	}, 10*time.Second, 5*time.Millisecond, "idle queues still held")
}

func TestIdleQueueGivesBackItsSlotAndItsRedisKeys(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, 50*time.Millisecond)
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "{http.fair_queue.model}", Permits: 1})

	for i := range 3 {
		req := model(t, h, "junk-"+strconv.Itoa(i))
		require.Equal(t, http.StatusOK, req.w.Code)
	}
	require.NotEmpty(t, rds.Keys(t, "{fair_queue:junk-*"), "the queues were in Redis")
	noEngines(t, h)
	// An engine leaves the registry before its leave has run (close waits
	// for its background releases first): the keys go with the leave.
	assert.Eventually(t, func() bool { return len(rds.Keys(t, "*")) == 0 }, 5*time.Second, 10*time.Millisecond,
		"an idle queue left keys in Redis: %v", rds.Keys(t, "*"))

	// The name is served again, by a new engine.
	assert.Equal(t, http.StatusOK, model(t, h, "junk-0").w.Code)
}

func TestNewNameTakesTheSlotOfAnIdleQueueAtTheCap(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, time.Hour) // only the cap frees a slot here
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.fair_queue.model}", Permits: 1})
	for i := range maxQueuesPerHandler {
		require.Equal(t, http.StatusOK, model(t, h, "junk-"+strconv.Itoa(i)).w.Code)
	}
	settled(t, h)
	served := model(t, h, "real")
	assert.Equal(t, http.StatusOK, served.w.Code, "a new name after the cap of idle queues")
	assert.Equal(t, "granted", served.placeholder(phOutcome))
	assert.Len(t, h.engineList(), maxQueuesPerHandler)
}

func TestNewNameIsRefusedWhileEverySlotHasARequest(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, time.Hour)
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.fair_queue.model}", Permits: 1})
	next := newHolder()
	var held []*request
	for i := range maxQueuesPerHandler {
		held = append(held, newRequest(context.Background(), `{"model":"busy-`+strconv.Itoa(i)+`"}`).start(h, next))
		next.waitEntered(t)
	}
	over := model(t, h, "one-too-many")
	assert.Equal(t, http.StatusTooManyRequests, over.w.Code)
	assert.Equal(t, "queue_full", over.placeholder(phOutcome))
	for range held {
		next.release <- struct{}{}
	}
	for _, req := range held {
		req.wait(t)
	}
	settled(t, h)
	assert.Equal(t, http.StatusOK, model(t, h, "one-too-many").w.Code, "served once a queue is idle")
}

// A request that arrives while its idle queue is being dropped (after
// the handler forgot the queue, before or while the pool releases it) is
// served, by the same engine or a new one, and nothing leaks: every
// reference is given back and Redis is left clean.
func TestRequestDuringTheIdleDropGetsAWorkingQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, 20*time.Millisecond)
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "{http.fair_queue.model}", Permits: 1})

	var mu sync.Mutex
	var during []*request
	drops := 0
	idleDropping = func(engineKey) {
		mu.Lock()
		defer mu.Unlock()
		drops++
		if drops > 6 {
			return
		}
		req := newRequest(context.Background(), `{"model":"m"}`).start(h, okHandler)
		if drops%2 == 1 {
			<-req.done // before the pool's release: the same engine
		} // else racing the release and the engine's close
		during = append(during, req)
	}
	t.Cleanup(func() { idleDropping = func(engineKey) {} })

	require.Equal(t, http.StatusOK, model(t, h, "m").w.Code)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return drops > 6
	}, 20*time.Second, 5*time.Millisecond, "idle drops")
	mu.Lock()
	reqs := during
	mu.Unlock()
	for i, req := range reqs {
		req.wait(t)
		assert.Equal(t, http.StatusOK, req.w.Code, "request %d during a drop", i)
		assert.Equal(t, "granted", req.placeholder(phOutcome), "request %d during a drop", i)
	}
	noEngines(t, h)
	noKeysLeft(t, rds)
}

// Requests keep coming to a few names while their queues go idle and are
// dropped between them: every one is served, and no reference leaks.
func TestQueuesDroppedAndReopenedUnderLoadServeEveryRequest(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, time.Millisecond)
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "{http.fair_queue.model}", Permits: 2})

	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := range 30 {
				req := newRequest(context.Background(), `{"model":"m`+strconv.Itoa(c%2)+`"}`).start(h, okHandler)
				<-req.done
				assert.Equal(t, http.StatusOK, req.w.Code, "client %d request %d", c, i)
				time.Sleep(time.Duration(i%4) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	noEngines(t, h)
	noKeysLeft(t, rds)
}

// noKeysLeft waits for Redis to hold no key: an engine leaves the
// registry before its close has left the queue (its Destruct runs after).
func noKeysLeft(t *testing.T, rds *redistest.Server) {
	t.Helper()
	assert.Eventually(t, func() bool { return len(rds.Keys(t, "*")) == 0 }, 10*time.Second, 10*time.Millisecond,
		"keys left in Redis: %v", rds.Keys(t, "*"))
}
