package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// slowAnswer hands its client's next answer that is no error (a script's
// NOSCRIPT is not it), once armed, only after its command's context ended: a process too loaded to read
// an answer Redis sent in time.
type slowAnswer struct{ armed atomic.Bool }

func (h *slowAnswer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slowAnswer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *slowAnswer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.armed.CompareAndSwap(true, false) {
			<-ctx.Done()
		}
		return err
	}
}

// The last leave's script is answered, but the instance reads that
// answer only at the end of the leave's context (a loaded process). The
// leave then takes the name out of the registry all the same: its own
// call gets a store timeout of its own. (Failed before the fix: the
// unregister was never sent, "leave {fair_queue:q}: unregister
// {fair_queue}:queues: context deadline exceeded", and the name of the
// queue given back stayed for the dead-queue sweep to find.)
func TestTheLastLeaveAnsweredAtItsDeadlineStillTakesTheNameOut(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	slow := &slowAnswer{}
	rdb.AddHook(slow)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	s := redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, s.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = s.Close() })
	_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 1})
	require.NoError(t, err)
	_, err = rdb.ZScore(ctx, redisstore.RegistryKey(""), "q").Result()
	require.NoError(t, err, "the registry names the queue")

	slow.armed.Store(true)
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	assert.NoError(t, s.Leave(lctx, "a", l))
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last leave")
}
