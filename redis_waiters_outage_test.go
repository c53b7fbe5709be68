package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md and reference.md (on_store_error): with fail_open and
// fail_closed, the requests already waiting in Redis' queue when Redis
// goes away keep waiting for it, up to their max_wait: neither admitted
// without a permit nor answered store_unavailable, they get the timeout
// reject at their max_wait, not later. A request that comes meanwhile is
// answered by the policy.
func TestWaitersQueuedInRedisKeepWaitingUpToMaxWaitWhenRedisDies(t *testing.T) {
	for _, tc := range []struct {
		policy    string
		newcomer  int    // the code a request that comes after gets
		newReason string // and its Fair-Queue-Reason
	}{
		{FailClosed, http.StatusServiceUnavailable, "store_unavailable"},
		{FailOpen, http.StatusOK, ""},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			const maxWait = 4 * time.Second
			h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "waiters-" + tc.policy, Permits: 1,
				OnStoreError: tc.policy, MaxWait: caddy.Duration(maxWait)})
			next := newHolder()
			held := newRequest(context.Background(), `{}`).start(h, next)
			next.waitEntered(t)
			start := time.Now()
			waiter := newRequest(context.Background(), `{}`).start(h, next)
			rdb := rds.Client(t)
			require.Eventually(t, func() bool {
				return rdb.ZCard(context.Background(), "{fair_queue:waiters-"+tc.policy+"}:waiting").Val() == 1
			}, 10*time.Second, 5*time.Millisecond, "the second request never queued in Redis")

			rds.Kill()
			took := waiter.waitFor(t, start, 3*maxWait)
			t.Logf("%s: waiter answered %d %q after %v", tc.policy, waiter.w.Code, waiter.w.Header().Get("Fair-Queue-Reason"), took)
			assert.Equal(t, http.StatusTooManyRequests, waiter.w.Code)
			assert.Equal(t, "timeout", waiter.w.Header().Get("Fair-Queue-Reason"))
			assert.GreaterOrEqual(t, took, maxWait-100*time.Millisecond, "answered before its max_wait")
			assert.Less(t, took, maxWait+time.Second, "answered past its max_wait")
			assert.Len(t, next.entered, 0, "the waiter reached the upstream")

			other := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
			assert.Equal(t, tc.newcomer, other.w.Code)
			assert.Equal(t, tc.newReason, other.w.Header().Get("Fair-Queue-Reason"))
			close(next.release)
			held.wait(t)
			// The waiter timed out, the newcomer was answered by the policy:
			// nothing is left counted against max_waiting_bytes.
			assert.Zero(t, waitingBytes.Load(), "bytes left counted")
		})
	}
}

// docs/failures.md, "When Redis fails": a request waiting in Redis'
// queue when Redis freezes (SIGSTOP) gets the timeout reject at its
// max_wait plus at most the store's timeout (fairqueue.DefaultStoreTimeout,
// a second): its ticket's cancel in Redis, which cannot answer, is sent
// before the answer (a waiter that timed out is out of the store when
// answered, the store contract's TimeoutRejectsWithPositionAndLeavesQueue)
// and runs to its timeouts. With a read_timeout of 3s that call runs to the
// store's timeout; the bound holds nonetheless. Once thawed, Redis holds no
// waiter: the cancel, or the next dispatch, took it out.
func TestWaiterQueuedInAFrozenRedisIsAnsweredWithinTheStoreTimeoutOfItsMaxWait(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "waiter-frozen"
	const maxWait = 3 * time.Second
	h := provision(t, newContext(t), "", &Handler{Name: name, Permits: 1, OnStoreError: FailClosed,
		MaxWait: caddy.Duration(maxWait),
		Redis:   &RedisConfig{Addresses: []string{rds.Addr()}, ReadTimeout: caddy.Duration(3 * time.Second)}})
	next := newHolder()
	held := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t)
	start := time.Now()
	waiter := newRequest(context.Background(), `{}`).start(h, next)
	rdb := rds.Client(t)
	waitingKey := "{fair_queue:" + name + "}:waiting"
	require.Eventually(t, func() bool {
		return rdb.ZCard(context.Background(), waitingKey).Val() == 1
	}, 10*time.Second, 5*time.Millisecond, "the second request never queued in Redis")

	rds.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rds.Thaw()
		}
	})
	took := waiter.waitFor(t, start, 3*maxWait)
	t.Logf("waiter answered %d %q after %v", waiter.w.Code, waiter.w.Header().Get("Fair-Queue-Reason"), took)
	assert.Equal(t, http.StatusTooManyRequests, waiter.w.Code)
	assert.Equal(t, "timeout", waiter.w.Header().Get("Fair-Queue-Reason"))
	assert.GreaterOrEqual(t, took, maxWait-100*time.Millisecond, "answered before its max_wait")
	assert.Less(t, took, maxWait+fairqueue.DefaultStoreTimeout+500*time.Millisecond,
		"answered past its max_wait and the store's timeout")
	assert.Len(t, next.entered, 0, "the waiter reached the upstream")

	rds.Thaw()
	thawed = true
	close(next.release)
	held.wait(t)
	assert.Eventually(t, func() bool {
		return rdb.ZCard(context.Background(), waitingKey).Val() == 0
	}, 10*time.Second, 20*time.Millisecond, "the timed-out waiter is left in Redis' queue")
}
