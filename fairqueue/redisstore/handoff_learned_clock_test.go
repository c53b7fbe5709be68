package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Redis' clock steps back (an NTP correction, a failover to a replica
// whose clock is behind) after a reply named heads to a node under a
// learned capacity: the record of when (K.members' field h) is then in
// the future. Another node's lowering of the queue's share is held back
// for HeadsTTL at most from when the step is seen, not until Redis'
// clock catches up (an hour here): a backend that is overloaded must
// see the capacity come down within a few reports.
func TestARedisClockSteppedBackDoesNotHoldTheLearnedShareUp(t *testing.T) {
	const name = "learnedclockback"
	ctx := context.Background()
	srv := redistest.Start(t)
	cfg := learnedCfg(200*time.Millisecond, 3*time.Second)
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	for _, n := range []*node{a, b} { // both join the queue
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	tm, err := a.rdb.Time(ctx).Result()
	require.NoError(t, err)
	members := redisstore.New(a.rdb, name, redisstore.Options{}).Tag() + ":members"
	// Heads named to another node, as Redis' clock read an hour ahead of now.
	require.NoError(t, a.rdb.HSet(ctx, members, "h", fmt.Sprintf("%d %s", tm.UnixMilli()+time.Hour.Milliseconds(), "elsewhere")).Err())

	deadline := time.Now().Add(10 * time.Second)
	for b.q.Share() == 1 {
		if time.Now().After(deadline) {
			t.Fatalf("b's breaches have not lowered the learned share in 10 s (window %v): a clock stepped back holds it up",
				a.rdb.HGetAll(ctx, adaptKey(a, name)).Val())
		}
		b.q.ObserveTTFT("", time.Second) // a breach, reported every interval
		time.Sleep(150 * time.Millisecond)
	}
	require.Equal(t, 0.5, b.q.Share())
}
