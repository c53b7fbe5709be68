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

// kvChat is a chat of about 101 KV-cache tokens: a 2-byte prompt and a
// completion budget of 100.
const kvChat = `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`

// A reload that turns kv_tokens on (150: one chat of ~101 tokens at a
// time) while requests of the old config, which counted no tokens, wait:
// once they are granted under the new config they weigh their tokens
// like the new config's own requests, so the upstream never holds more
// than kv_tokens, on either store.
func TestAReloadThatTurnsKVTokensOnWeighsTheWaitersOfTheOldConfig(t *testing.T) {
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "local store", true: "redis store"}[redis], func(t *testing.T) {
			f := newKVReload(t, redis, func(kvTokens int) *Handler {
				return &Handler{Name: "kv-on", Permits: 2, KVTokens: kvTokens, MaxWait: caddy.Duration(time.Minute)}
			})
			up := f.up
			old := f.provisioned(f.in(0))
			var all []*request
			for range 2 { // the old config's 2 permits run
				all = append(all, newRequest(context.Background(), kvChat).start(old, up))
				up.waitEntered(t)
			}
			for i := range 2 { // its waiters
				all = append(all, newRequest(context.Background(), kvChat).start(old, up))
				waitingIn(t, old, i+1)
			}

			cur := f.provisioned(f.in(150))
			require.NoError(t, old.Cleanup())
			all = append(all, newRequest(context.Background(), kvChat).start(cur, up))
			waitingIn(t, cur, 3) // its first request applied the new settings

			// The old config's running requests end: the next grant is the
			// first waiter's, alone, as its ~101 tokens leave no room for
			// another under 150.
			up.release <- struct{}{}
			up.release <- struct{}{}
			up.waitEntered(t)
			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, int32(3), up.count.Load(),
				"requests granted beside the first waiter, above kv_tokens 150")

			f.releaseAll()
			for _, r := range all {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
			f.leave(cur)
		})
	}
}

// kvHeavyChat is a chat of about 301 KV-cache tokens: a 2-byte prompt
// and a completion budget of 300.
const kvHeavyChat = `{"model":"m","max_tokens":300,"messages":[{"role":"user","content":"hi"}]}`

// A reload that raises kv_tokens (150 to 350) while a request heavier
// than the old capacity waits (~301 tokens, clamped to 150 to run
// alone): under the new capacity it weighs its ~301 tokens, not the old
// clamp, so it and a chat of ~101 tokens never run together (402 tokens,
// above 350), on either store.
func TestAReloadThatRaisesKVTokensWeighsAClampedWaiterInFull(t *testing.T) {
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "local store", true: "redis store"}[redis], func(t *testing.T) {
			f := newKVReload(t, redis, func(kvTokens int) *Handler {
				return &Handler{Name: "kv-raised", Permits: 4, KVTokens: kvTokens, MaxWait: caddy.Duration(time.Minute)}
			})
			up := f.up
			old := f.provisioned(f.in(150))
			r0 := newRequest(context.Background(), kvChat).start(old, up)
			up.waitEntered(t)
			heavy := newRequest(context.Background(), kvHeavyChat).start(old, up)
			waitingIn(t, old, 1)

			cur := f.provisioned(f.in(350))
			require.NoError(t, old.Cleanup())
			n1 := newRequest(context.Background(), kvChat).start(cur, up)
			// Its ~301 tokens do not fit beside r0's ~101 under 350.
			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, int32(1), up.count.Load(),
				"the heavy waiter granted beside r0, weighed as the old clamp, above kv_tokens 350")

			up.release <- struct{}{} // r0 ends: the heavy waiter runs, alone
			require.Eventually(t, func() bool { return up.count.Load() >= 2 }, 10*time.Second, time.Millisecond)
			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, int32(2), up.count.Load(),
				"a chat granted beside the heavy waiter, above kv_tokens 350")

			f.releaseAll()
			for _, r := range []*request{r0, heavy, n1} {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
			f.leave(cur)
		})
	}
}

// kvReload is a reload test's fixture: handlers made by in, provisioned
// on the local store or on a Redis of its own, and an upstream that holds
// every request until released.
type kvReload struct {
	t        *testing.T
	in       func(kvTokens int) *Handler
	rds      *redistest.Server // nil: the local store
	up       *holder
	released bool
}

func newKVReload(t *testing.T, redis bool, in func(kvTokens int) *Handler) *kvReload {
	t.Cleanup(func() { poolEmpty(t) })
	f := &kvReload{t: t, in: in, up: newHolder()}
	if redis {
		f.rds = redistest.Start(t)
	}
	t.Cleanup(func() {
		if !f.released {
			close(f.up.release)
		}
	})
	return f
}

func (f *kvReload) provisioned(h *Handler) *Handler {
	if f.rds == nil {
		return provisionLocal(f.t, newContext(f.t), h)
	}
	return provision(f.t, newContext(f.t), f.rds.Addr(), h)
}

// releaseAll lets every request held at the upstream, and every later
// one, run to its end.
func (f *kvReload) releaseAll() {
	close(f.up.release)
	f.released = true
}

// leave unloads cur, the last config, and checks Redis has no key left.
func (f *kvReload) leave(cur *Handler) {
	if f.rds == nil {
		return
	}
	require.NoError(f.t, cur.Cleanup())
	poolEmpty(f.t)
	assert.Empty(f.t, f.rds.Keys(f.t, "*"), "keys left in Redis")
}
