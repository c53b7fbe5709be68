package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A reload that moves a queue with kv_tokens (250: two chats of ~101
// tokens at a time) from Redis to the local store, and back, while two
// chats of the old config run: the new queue counts their tokens until
// they end, so a third chat waits for one of them.
func TestAReloadThatMovesTheStoreCountsTheTokensRunningInTheOld(t *testing.T) {
	for _, toRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "redis to local", true: "local to redis"}[toRedis], func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			up := newHolder()
			letAtCleanup(t, up)
			in := func(redis bool) *Handler {
				h := &Handler{Name: "kv-moved", Permits: 4, KVTokens: 250, MaxWait: caddy.Duration(time.Minute)}
				if redis {
					return provision(t, newContext(t), rds.Addr(), h)
				}
				return provisionLocal(t, newContext(t), h)
			}
			old := in(!toRedis)
			var all []*request
			for range 2 {
				all = append(all, newRequest(context.Background(), kvChat).start(old, up))
				up.waitEntered(t)
			}
			cur := in(toRedis)
			require.NoError(t, old.Cleanup())
			all = append(all, newRequest(context.Background(), kvChat).start(cur, up))
			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, int32(2), up.count.Load(), "a chat granted beside the two running in the old store, above kv_tokens 250")

			up.release <- struct{}{}
			require.Eventually(t, func() bool { return up.count.Load() == 3 }, 10*time.Second, 5*time.Millisecond,
				"an old chat ended, and the new one is not granted")
			up.let()
			for _, r := range all {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
			require.NoError(t, cur.Cleanup())
		})
	}
}

// A reload that moves a queue from the local store to Redis, or back,
// and turns kv_tokens on (150: one chat of ~101 tokens at a time) while
// the old config's requests, which counted no tokens, wait: they move to
// the new queue and, granted there, weigh their tokens, so two of them
// never run at once.
func TestAReloadThatMovesTheStoreAndTurnsKVTokensOnWeighsTheMovedWaiters(t *testing.T) {
	for _, toRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "redis to local", true: "local to redis"}[toRedis], func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			up := newHolder()
			letAtCleanup(t, up)
			in := func(redis bool, kvTokens int) *Handler {
				h := &Handler{Name: "kv-moved-on", Permits: 1, KVTokens: kvTokens, MaxWait: caddy.Duration(time.Minute)}
				if kvTokens > 0 {
					h.Permits = 4
				}
				if redis {
					return provision(t, newContext(t), rds.Addr(), h)
				}
				return provisionLocal(t, newContext(t), h)
			}
			old := in(!toRedis, 0)
			all := []*request{newRequest(context.Background(), kvChat).start(old, up)}
			up.waitEntered(t)
			for i := range 3 { // the old config's waiters
				all = append(all, newRequest(context.Background(), kvChat).start(old, up))
				waitingIn(t, old, i+1)
			}
			cur := in(toRedis, 150)
			require.NoError(t, old.Cleanup())
			up.release <- struct{}{} // the old config's running chat ends
			for i := range 3 {       // each moved waiter runs alone
				up.waitEntered(t)
				time.Sleep(300 * time.Millisecond)
				assert.Equal(t, int32(2+i), up.count.Load(), "two chats of ~101 tokens ran at once, above kv_tokens 150")
				up.release <- struct{}{}
			}
			up.let()
			for _, r := range all {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
			require.NoError(t, cur.Cleanup())
		})
	}
}
