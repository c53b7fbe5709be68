package redisstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// rollbackTokensCfg is rollbackCfg bounded by 100 KV-cache tokens, with
// permits to spare: two requests of 60 tokens never run at once.
var rollbackTokensCfg = fairqueue.Config{Permits: 10, KVTokens: 100, MaxWait: 10 * time.Second,
	PollInterval: 100 * time.Millisecond, Lease: 30 * time.Second}

// sixty is a request of 60 tokens: two do not fit rollbackTokensCfg.
var sixty = fairqueue.Request{Tokens: 60}

// A grant of 60 tokens a failover lost is counted again with its weight
// at the resubscribe: a request of 60 tokens of another node waits for
// it (60 + 60 > 100) instead of running beside it, and is served once it
// ends; Redis counts no tokens once everyone leaves.
func TestLostTokenGrantIsCountedAgainWithItsWeight(t *testing.T) {
	s := warmScene(t, "lost-token-grant", rollbackTokensCfg)
	a, b := s.a, s.b

	rollback := snapshot(t, s.admin)
	held, err := a.q.Acquire(s.ctx, sixty) // the grant: lost
	require.NoError(t, err)
	rollback(func() { require.Zero(t, s.tokens(t), "the rollback lost a's grant") })
	eventually(t, 5*time.Second, func() bool { return s.tokens(t) == 60 }, "a's request is not counted again with its 60 tokens")
	beside := acquireReq(b, s.ctx, sixty)
	stillWaiting(t, beside, "b's request of 60 tokens started beside a's: 120 tokens held of 100")
	held.Release()
	r := waitFor(t, beside, "b's request")
	require.NoError(t, r.err)
	assert.Equal(t, 60, s.tokens(t), "b's request alone")
	r.p.Release()
	s.noTokens(t)
	s.leave(t)
}

// A release of 60 tokens a failover lost is released again after the
// resubscribe: a request of 60 tokens of another node is served within
// its max wait (a lease shorter than the lease), and the tokens Redis
// counts are its own alone.
func TestLostTokenReleaseIsReleasedAgain(t *testing.T) {
	s := warmScene(t, "lost-token-release", rollbackTokensCfg)
	a, b := s.a, s.b

	held, err := a.q.Acquire(s.ctx, sixty)
	require.NoError(t, err)
	rollback := snapshot(t, s.admin)
	held.Release() // the release: lost
	eventually(t, 5*time.Second, func() bool { return s.tokens(t) == 0 }, "the release never reached Redis")
	rollback(func() { require.Equal(t, 60, s.tokens(t), "the rollback brought the 60 tokens back") })
	r := waitFor(t, acquireReq(b, s.ctx, sixty), "b's request")
	require.NoError(t, r.err, "b's request, with the 60 tokens released again")
	assert.Equal(t, 60, s.tokens(t), "b's request alone")
	r.p.Release()
	s.noTokens(t)
	s.leave(t)
}

// A waiter of 60 tokens a failover lost (its acquire) is queued again
// with its weight: granted once the holder ends, it keeps a later request
// of 60 tokens out until it ends.
func TestLostTokenAcquireIsQueuedAgainWithItsWeight(t *testing.T) {
	s := warmScene(t, "lost-token-acquire", rollbackTokensCfg)
	a, b := s.a, s.b

	held, err := a.q.Acquire(s.ctx, sixty)
	require.NoError(t, err)
	rollback := snapshot(t, s.admin)
	lost := acquireReq(b, s.ctx, sixty) // b's waiter: lost
	s.waiting(t, 1, "b's waiter never queued")
	rollback(func() { require.Empty(t, s.state(t).Waiting, "the rollback lost b's waiter") })
	s.waiting(t, 1, "b's waiter was not queued again")
	held.Release()
	first := waitFor(t, lost, "b's waiter")
	require.NoError(t, first.err, "b's waiter, queued again")
	assert.Equal(t, 60, s.tokens(t), "b's request counts its 60 tokens")
	later := acquireReq(a, s.ctx, sixty)
	stillWaiting(t, later, "a's request of 60 tokens started beside b's: 120 tokens held of 100")
	first.p.Release()
	served(t, later, "a's request")
	s.noTokens(t)
	s.leave(t)
}
