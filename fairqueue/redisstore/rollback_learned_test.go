package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A failover loses Redis' record that a reply named heads to node a
// (K.members' field h): another node's lowering of the learned share is
// then not held back, while a may still hold the heads. Once a has seen
// the failover (its new subscription), it hands on to none named before
// it, and the replies after it name none while more than the learned
// permits run: a permit that ends must not start its next waiter. (Before
// a sees it, the heads serve at most HeadsTTL from the call that named
// them.)
func TestHeadsNamedBeforeAFailoverThatLostTheirRecordDoNotServe(t *testing.T) {
	const name = "learnedfailover"
	longHeads(t) // a's heads still serve, but for the failover, when the share has come down
	ctx := context.Background()
	cfg := learnedCfg(time.Second, 30*time.Second)
	a := newNode(t, redistest.Start(t), name, cfg)
	held := holdFour(t, a)
	holders := readState(t, a.rdb, name).Holders
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, w2 := queueWaiter(t, a, name)
	alive(t, a)
	members := redisstore.New(a.rdb, name, redisstore.Options{}).Tag() + ":members"
	require.False(t, a.rdb.HExists(ctx, members, "h").Val(), "heads named before the snapshot")
	rollback := snapshot(t, a.rdb)

	named := time.Now()
	held[0].Release() // w1 takes it; the reply names w2 the head, and Redis records it
	w1 := <-w1Ch
	require.NoError(t, w1.err)
	require.True(t, a.rdb.HExists(ctx, members, "h").Val(), "Redis did not record the heads it named")
	ghost := slices.DeleteFunc(slices.Clone(holders), func(id string) bool { return slices.Contains(readState(t, a.rdb, name).Holders, id) })
	require.Len(t, ghost, 1, "held[0]'s release")

	// Another node's breach, in the data set the failover left: nothing
	// holds it back.
	b := redisstore.New(a.rdb, name, redisstore.Options{})
	ad := cfg.Adaptive
	rollback(func() {
		require.False(t, a.rdb.HExists(ctx, members, "h").Val(), "the failover kept the record of the heads")
		require.Contains(t, readState(t, a.rdb, name).Holders, ghost[0], "the failover kept held[0]'s release")
		shares, err := b.Adapt(ctx, fairqueue.AdaptArgs{Node: "b", Reports: []fairqueue.AdaptReport{{Samples: 1, Over: 1}},
			Floor: 1.0 / 16, Decrease: ad.Decrease, Step: 1.0 / 64, BreachShare: 0.01, Interval: ad.Interval, MinSamples: 1})
		require.NoError(t, err)
		require.Equal(t, 0.5, shares[""], "b's report was held back")
	})
	// a sees the failover: it subscribes again, and reconciles the release
	// the failover lost.
	eventually(t, 5*time.Second, func() bool { return !slices.Contains(readState(t, a.rdb, name).Holders, ghost[0]) },
		"a never released held[0] again after the failover")
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of the share")
	require.Less(t, time.Since(named), longHeadsTTL, "a's heads were spent before the share came down")

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	assert.NotContains(t, readState(t, a.rdb, name).Holders, w2, "w2 started with 3 running under a learned capacity of 2 (4 x 0.5)")
	select {
	case g := <-w2Ch:
		t.Fatalf("w2 started with 3 running under a learned capacity of 2 (err %v)", g.err)
	default:
	}
	w1.p.Release()
	held[2].Release()
	held[3].Release()
	got := <-w2Ch
	require.NoError(t, got.err)
	got.p.Release()
}
