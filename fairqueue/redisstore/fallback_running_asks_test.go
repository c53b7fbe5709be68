package redisstore_test

import (
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request heavier than kv_tokens 50 that Redis granted at what it asks
// (70) across a rolling reload to 100 (askedAcrossReload), and Redis
// goes away: the fallback queue of its instance, dealt its part of the
// 100 tokens from the weights its requests held at its last heartbeat
// (70, above its part of 50), must count the running request at those
// 70 too, and admit nothing more: counted at its clamped 50, 20 tokens
// more ran beside it, while the other instance's fallback queue was
// dealt the 20 free.
func TestLocalFallbackCountsARunningRequestAtTheWeightRedisGrantedIt(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	_, b, _, _ := askedAcrossReload(t, srv, "fbasks")
	srv.Kill()
	eventually(t, 10*time.Second, func() bool {
		if p := tryAcquire(t, b, fairqueue.Request{Tokens: 1}, 100*time.Millisecond); p != nil {
			p.Release()
		}
		return !b.q.Stats().StoreUp
	}, "Redis never marked down")
	if p := tryAcquire(t, b, fairqueue.Request{Tokens: 20}, time.Second); p != nil {
		p.Release()
		t.Fatalf("b's fallback queue admitted 20 tokens beside its request Redis counted at 70 (clamped to 50 " +
			"when it queued), above its part of kv_tokens 100 (50): the 20 tokens free are a's part")
	}
}
