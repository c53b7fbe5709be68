package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A rolling change that turns kv_tokens on: node w counts tokens (100),
// node n not yet. n's release grants w's waiter, which weighs 80, and
// its request runs holding them. Once w's first request ended, w's next
// of 80 tokens must wait for it: granted, 160 tokens would run under a
// capacity of 100, by w's own call. The waiter's weight, recorded when
// it queued, went with n's grant, uncounted: w granted at once.
func TestAWaiterGrantedByANodeWithoutTokensStillCountsItsWeight(t *testing.T) {
	rdb, s := openStore(t, "tokmix")
	ctx := context.Background()
	plain := noTokens(10)
	w := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: "w:" + id, Node: "w", Limits: tokensCounted, Cost: 1, Tokens: 80}
	}
	acquireGranted(t, s, w("1"))
	r, err := s.Acquire(ctx, w("2"))
	require.NoError(t, err)
	require.False(t, r.Granted, "80 + 80 tokens do not fit 100")

	// n ends a request of its own: its call, counting no tokens, grants
	// w's waiter.
	n1 := fairqueue.TicketArgs{ID: "n:1", Node: "n", Limits: plain, Cost: 1}
	acquireGranted(t, s, n1)
	require.NoError(t, s.Release(ctx, n1))
	require.Contains(t, readState(t, rdb, "tokmix").Holders, "w:2", "n's release granted w's waiter")

	require.NoError(t, s.Release(ctx, w("1")))
	r, err = s.Acquire(ctx, w("3"))
	require.NoError(t, err)
	assert.False(t, r.Granted, "w granted 80 tokens beside w:2's 80 under a capacity of 100")
	require.NoError(t, s.Release(ctx, w("2")))
	bothLeave(t, rdb, s, plain)
}

// A reload that turns kv_tokens off on node n while n's waiter, weighing
// 80, waits (node w still counts tokens, 100: a rolling change). n's
// release, counting no tokens, hands its permit on to that waiter in
// process (a local handoff, recorded by Transfer): its request runs
// holding its 80 tokens, as one granted by n's dispatch does. w's next
// request of 80 must wait for it: granted, 160 tokens would run under a
// capacity of 100, by w's own call.
func TestAWaiterHandedOnByANodeWithoutTokensStillCountsItsWeight(t *testing.T) {
	rdb, s := openStore(t, "tokmixhandoff")
	ctx := context.Background()
	plain := noTokens(10)
	n1, n2, _ := thirtyThenEighty(t, s)

	// n reloaded without kv_tokens: n:1 ends and n hands its permit on
	// to n:2, the head of the queue.
	n1.Limits = plain
	require.NoError(t, s.Transfer(ctx, n1, "n:2"))
	require.Equal(t, []string{"n:2"}, readState(t, rdb, "tokmixhandoff").Holders, "n's transfer gave n:2 the permit")

	eightyKeptOut(t, s, "n:2")
	n2.Limits = plain
	require.NoError(t, s.Release(ctx, n2))
	bothLeave(t, rdb, s, plain)
}

// A reload that turns kv_tokens off on node n while n's request, granted
// weighing 80, runs (node w still counts tokens, 100: a rolling change).
// Redis then loses n's holder entry: its data set (a restart without
// persistence, a flush), or the grant's last writes (a failover that kept
// the epoch key). n's heartbeat counts the request again, naming its
// weight: the request still holds its 80 tokens, so w's request of 80
// must wait for it. Counted without its weight (n's limits count no
// tokens), w granted 160 tokens under a capacity of 100.
func TestAHolderReaddedByANodeWithoutTokensStillCountsItsWeight(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(t *testing.T, rdb *redis.Client, tag string)
	}{
		{"data set lost", func(t *testing.T, rdb *redis.Client, _ string) {
			require.NoError(t, rdb.FlushAll(context.Background()).Err())
		}},
		{"grant lost", func(t *testing.T, rdb *redis.Client, tag string) {
			ctx := context.Background()
			require.NoError(t, rdb.ZRem(ctx, tag+":holders", "n:1").Err())
			require.NoError(t, rdb.Del(ctx, tag+":thold", tag+":tsum").Err())
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb, s := openStore(t, "tokmixbeat")
			ctx := context.Background()
			plain := noTokens(10)
			n1 := fairqueue.TicketArgs{ID: "n:1", Node: "n", Limits: tokensCounted, Cost: 1, Tokens: 80}
			r := acquireGranted(t, s, n1)
			beat := func(no uint64) fairqueue.HeartbeatResult {
				res, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n", Limits: plain, Held: []string{"n:1"},
					Tokens: map[string]int{"n:1": 80}, Epoch: r.Epoch, Beat: no})
				require.NoError(t, err)
				return res
			}
			beat(1)
			c.lose(t, rdb, s.Tag())
			require.NotContains(t, readState(t, rdb, "tokmixbeat").Holders, "n:1")
			require.Equal(t, []string{"n:1"}, beat(2).Readded, "n's heartbeat counted its running request again")

			eightyKeptOut(t, s, "n:1")
			n1.Limits = plain
			require.NoError(t, s.Release(ctx, n1))
			bothLeave(t, rdb, s, plain)
		})
	}
}

// A reload that turns kv_tokens off on node n while n's waiter, weighing
// 80, waits (node w still counts tokens, 100: a rolling change). Redis
// then loses the waiter (an eviction, a failover that lost its acquire):
// n's heartbeat finds it missing and n queues it again, with the weight
// it was queued with and n's limits, which count no tokens. Granted (at
// once, or later by a release), its request holds its 80 tokens, so w's
// request of 80 must wait for it. Queued again without its weight, w
// granted 160 tokens under a capacity of 100.
func TestAWaiterReinstatedByANodeWithoutTokensStillCountsItsWeight(t *testing.T) {
	for _, c := range []struct {
		name    string
		permits int // n's, after its reload
	}{{"granted at once", 10}, {"granted by a release", 1}} {
		t.Run(c.name, func(t *testing.T) {
			rdb, s := openStore(t, "tokmixlost")
			ctx := context.Background()
			plain := noTokens(c.permits)
			n1, n2, epoch := thirtyThenEighty(t, s)

			// Redis loses n:2's entries; n, reloaded without kv_tokens,
			// finds it missing and queues it again.
			tag := s.Tag()
			require.NoError(t, rdb.ZRem(ctx, tag+":waiting", "n:2").Err())
			require.NoError(t, rdb.HDel(ctx, tag+":tok", "n:2").Err())
			res, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n", Limits: plain, Held: []string{"n:1"},
				Pending: []string{"n:2"}, Tokens: map[string]int{"n:1": 30}, Epoch: epoch, Beat: 1})
			require.NoError(t, err)
			require.Equal(t, []string{"n:2"}, res.Missing)
			n1.Limits, n2.Limits = plain, plain
			if c.permits > 1 {
				require.NoError(t, s.Release(ctx, n1))
			}
			_, err = s.Acquire(ctx, n2)
			require.NoError(t, err)
			if c.permits == 1 {
				require.NoError(t, s.Release(ctx, n1))
			}
			require.Equal(t, []string{"n:2"}, readState(t, rdb, "tokmixlost").Holders, "n:2 runs")

			eightyKeptOut(t, s, "n:2")
			require.NoError(t, s.Release(ctx, n2))
			bothLeave(t, rdb, s, plain)
		})
	}
}

// A reload that turns kv_tokens off on node n while n's waiter, weighing
// 80, waits (node w still counts tokens, 100: a rolling change). Redis
// then loses its data (a restart without persistence), and n, not told
// yet, hands its ended request's permit on in process to that waiter:
// the transfer counts it again as a holder, as a heartbeat counts one
// Redis lost, but knows no weight for it. n's next heartbeat names its
// weight: the request holds its 80 tokens, so w's request of 80 must
// wait for it. The heartbeat, finding the holder counted, left it
// weighing nothing: w granted 160 tokens under a capacity of 100.
func TestAWaiterHandedOnAfterADataLossStillCountsItsWeight(t *testing.T) {
	rdb, s := openStore(t, "tokmixxferlost")
	ctx := context.Background()
	plain := noTokens(10)
	n1, n2, epoch := thirtyThenEighty(t, s)

	require.NoError(t, rdb.FlushAll(ctx).Err())
	n1.Limits, n2.Limits = plain, plain
	require.NoError(t, s.Transfer(ctx, n1, "n:2"))
	_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n", Limits: plain, Held: []string{"n:2"},
		Tokens: map[string]int{"n:2": 80}, Epoch: epoch, Beat: 1})
	require.NoError(t, err)
	require.Equal(t, []string{"n:2"}, readState(t, rdb, "tokmixxferlost").Holders, "n:2 runs")

	eightyKeptOut(t, s, "n:2")
	require.NoError(t, s.Release(ctx, n2))
	bothLeave(t, rdb, s, plain)
}
