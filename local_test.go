package caddyfairqueue

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// provisionLocal provisions a handler without Redis (its queues live in
// the process) in ctx, and cleans it up when the test ends.
func provisionLocal(t *testing.T, ctx caddy.Context, h *Handler) *Handler {
	t.Helper()
	require.Nil(t, h.Redis)
	if h.PollInterval == 0 {
		h.PollInterval = caddy.Duration(50 * time.Millisecond)
	}
	require.NoError(t, h.Provision(ctx))
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// waitingIn waits until the store of the handler's only engine queues n
// tickets. (The engine counts a waiter before its store call, which a
// later request can overtake: only the store's queue defines the order.)
func waitingIn(t *testing.T, h *Handler, n int) {
	t.Helper()
	e := engineOf(t, h)
	require.Eventually(t, func() bool {
		snap, err := e.q.Inspect(context.Background(), 0, 0)
		return err == nil && snap.Waiting == n
	}, 5*time.Second, 5*time.Millisecond, "want %d waiting", n)
}

func TestLocalQueueQueuesBeyondPermitsAndHandsOverOnRelease(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "local-fifo", Permits: 1})
	next := newHolder()

	a := newRequest(context.Background(), `{"model":"m"}`).start(h, next)
	next.waitEntered(t)
	assert.Equal(t, "granted", a.placeholder(phOutcome))
	assert.Equal(t, "0", a.placeholder(phPosition))

	var waiters []*request
	for i := range 3 {
		waiters = append(waiters, newRequest(context.Background(), `{}`).start(h, next))
		waitingIn(t, h, i+1) // each joins before the next: a defined order
	}
	select {
	case <-next.entered:
		t.Fatal("a waiter passed while the only permit was held")
	case <-time.After(100 * time.Millisecond):
	}
	next.release <- struct{}{}
	a.wait(t)
	for i, w := range waiters {
		next.waitEntered(t)
		next.release <- struct{}{}
		w.wait(t)
		assert.Equal(t, "granted", w.placeholder(phOutcome))
		assert.Equal(t, strconv.Itoa(i+1), w.placeholder(phPosition), "FIFO: waiter %d", i)
	}
	assert.Equal(t, int32(4), next.count.Load())
}

func TestLocalQueueRejectsAfterMaxWaitAndWhenFull(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "local-reject", Permits: 1,
		MaxWait: caddy.Duration(300 * time.Millisecond), MaxQueue: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	defer func() { close(next.release); a.wait(t) }()

	b := newRequest(context.Background(), `{}`).start(h, next)
	waitingIn(t, h, 1)
	full := newRequest(context.Background(), `{"stream":false}`).start(h, next).wait(t)
	require.NoError(t, full.err)
	assert.Equal(t, http.StatusTooManyRequests, full.w.Code)
	assert.Equal(t, "queue_full", full.w.Header().Get("Fair-Queue-Reason"))
	assert.NotEmpty(t, full.w.Header().Get("Retry-After"))
	assert.Equal(t, "queue_full", full.placeholder(phOutcome))

	b.wait(t)
	assert.Equal(t, http.StatusTooManyRequests, b.w.Code)
	assert.Equal(t, "timeout", b.w.Header().Get("Fair-Queue-Reason"))
	assert.Equal(t, int32(1), next.count.Load(), "no rejected request reached the next handler")
}

func TestLocalQueueReloadKeepsWaitersInOrder(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	old := provisionLocal(t, newContext(t), &Handler{Name: "local-reload", Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(old, next)
	next.waitEntered(t)
	b := newRequest(context.Background(), ``).start(old, next)
	waitingIn(t, old, 1)

	// Reload: the new config is provisioned, then the old one cleaned up
	// while its requests still run and wait.
	updated := provisionLocal(t, newContext(t), &Handler{Name: "local-reload", Permits: 1})
	require.Same(t, engineOf(t, old), engineOf(t, updated), "one engine across the reload")
	require.NoError(t, old.Cleanup())
	c := newRequest(context.Background(), ``).start(updated, next)
	waitingIn(t, updated, 2)

	next.release <- struct{}{} // a finishes: b, who waited through the reload, is next
	a.wait(t)
	next.waitEntered(t)
	assert.Equal(t, "granted", b.placeholder(phOutcome))
	assert.Equal(t, "1", b.placeholder(phPosition))
	next.release <- struct{}{}
	b.wait(t)
	next.waitEntered(t)
	next.release <- struct{}{}
	c.wait(t)
	assert.Equal(t, "2", c.placeholder(phPosition))
}

func TestLocalQueueRetiredAndNewEngineShareThePermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	old := provisionLocal(t, newContext(t), &Handler{Name: "local-share", Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(old, next)
	next.waitEntered(t)
	retired := engineOf(t, old)

	// A reload that drops the queue, then one that brings it back while
	// a still runs on the retired engine: a new engine, the same store.
	require.NoError(t, old.Cleanup())
	back := provisionLocal(t, newContext(t), &Handler{Name: "local-share", Permits: 1})
	require.NotSame(t, retired, engineOf(t, back))
	b := newRequest(context.Background(), ``).start(back, next)
	select {
	case <-next.entered:
		t.Fatal("the new engine admitted a request beyond the permits held by the retired one")
	case <-time.After(200 * time.Millisecond):
	}
	next.release <- struct{}{}
	a.wait(t)
	next.waitEntered(t)
	next.release <- struct{}{}
	b.wait(t)
	assert.Equal(t, "granted", b.placeholder(phOutcome))
}

func TestLocalQueueSaysOnceThatItIsLocal(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	core, logs := observer.New(zap.InfoLevel)
	b, err := newStore(nil, caddy.NewReplacer(), zap.New(core))
	require.NoError(t, err)
	assert.Equal(t, "local", b.storeID())
	_, release1, err := b.open("q")
	require.NoError(t, err)
	_, release2, err := b.open("q") // a second engine of the same queue
	require.NoError(t, err)
	_, release3, err := b.open("other")
	require.NoError(t, err)
	release1()
	release2()
	release3()

	entries := logs.FilterMessageSnippet("local to this instance").All()
	require.Len(t, entries, 2, "once per queue")
	assert.Equal(t, "q", entries[0].ContextMap()["queue"])
	assert.Equal(t, "other", entries[1].ContextMap()["queue"])
}

func TestOldHandlerAfterCleanupOpensNoMoreThanTheQueueCap(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "late-{http.request.header.X-Queue}", Permits: 1})
	require.NoError(t, h.Cleanup())
	// Requests that reach the old handler after the reload may borrow
	// queues, but no more of them than a live handler opens.
	for i := range maxQueuesPerHandler {
		req := newRequest(context.Background(), `{}`, "X-Queue", strconv.Itoa(i)).start(h, okHandler).wait(t)
		require.Equal(t, "granted", req.placeholder(phOutcome), "queue %d", i)
	}
	again := newRequest(context.Background(), `{}`, "X-Queue", "7").start(h, okHandler).wait(t)
	assert.Equal(t, "granted", again.placeholder(phOutcome), "a queue already borrowed")
	over := newRequest(context.Background(), `{}`, "X-Queue", "one-too-many").start(h, okHandler).wait(t)
	assert.Equal(t, http.StatusTooManyRequests, over.w.Code)
	assert.Equal(t, "queue_full", over.placeholder(phOutcome))
}

func TestRefusedQueueNamesNeverReachMetricLabels(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	reg := prometheus.NewRegistry()
	registerMetrics(reg)
	h := provisionLocal(t, newContext(t), &Handler{Name: "m-{http.request.header.X-Queue}", Permits: 1})
	secret := "client-chosen-" + strings.Repeat("z", maxQueueNameLen)
	req := newRequest(context.Background(), `{}`, "X-Queue", secret).start(h, okHandler).wait(t)
	assert.Equal(t, "queue_full", req.placeholder(phOutcome))
	ok := newRequest(context.Background(), `{}`, "X-Queue", "a").start(h, okHandler).wait(t)
	assert.Equal(t, "granted", ok.placeholder(phOutcome))

	families, err := reg.Gather()
	require.NoError(t, err)
	labels := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" {
					labels[l.GetValue()] = true
				}
			}
		}
	}
	assert.True(t, labels[overflowQueue], "the refused request is counted under %s: %v", overflowQueue, labels)
	assert.True(t, labels["m-a"], "an opened queue keeps its name: %v", labels)
	for l := range labels {
		assert.NotContains(t, l, "client-chosen", "a refused name reached a metric label")
	}
}

func TestShortMaxWaitWithoutPollIntervalIsAValidConfig(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	require.NoError(t, validate(t, `:8080 {
	fair_queue {
		permits 1
		max_wait 100ms
	}
	respond ok
}
`))
	h := &Handler{Name: "short", Permits: 1, MaxWait: caddy.Duration(100 * time.Millisecond)}
	require.NoError(t, h.Provision(newContext(t)))
	t.Cleanup(func() { _ = h.Cleanup() })
	assert.Equal(t, caddy.Duration(100*time.Millisecond), h.PollInterval, "the default interval follows a short max_wait")
}
