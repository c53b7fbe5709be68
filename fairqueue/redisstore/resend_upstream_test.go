package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that adds a pool, while a waiter's acquire, sent under the old
// settings (no pool), is on its way and its answer is lost: the client
// sends the script again (go-redis retries it after a read timeout), and
// meanwhile a release under the new settings granted the waiter on
// upstream a. The re-sent acquire must answer that upstream, as the
// grant's message does: the node routes the request by it (through the
// new config's route to a). Answered no upstream, the request ran on the
// old route's static upstream while Redis counted it on a only, so b,
// that static upstream, could be granted beside it: 2 requests on an
// upstream of 1 permit. The same holds for a re-sent requeue.
func TestAReSentAcquireAnswersTheUpstreamItsGrantNamesWhateverPoolItCarries(t *testing.T) {
	rdb, s := openStore(t, "resendup")
	ctx := context.Background()
	pool := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	plain := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}
	acquire := func(a fairqueue.TicketArgs) fairqueue.AcquireResult {
		r, err := s.Acquire(ctx, a)
		require.NoError(t, err)
		return r
	}
	first := fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: pool, Cost: 1}
	require.Equal(t, "a:1", acquire(first).Upstream)
	require.Equal(t, "b:1", acquire(fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: pool, Cost: 1}).Upstream)
	waiter := fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: plain, Cost: 1} // sent before the reload
	require.False(t, acquire(waiter).Granted, "2 permits held: it waits")

	// The reload's first release hands a on to the waiter.
	require.NoError(t, s.Release(ctx, first))
	require.ElementsMatch(t, []string{"n1:2", "n1:3"}, readState(t, rdb, "resendup").Holders, "the waiter granted")
	on, err := rdb.HGet(ctx, s.Tag()+":uheld", "n1:3").Result()
	require.NoError(t, err)
	require.Equal(t, "a:1", on, "Redis counts the waiter on a")

	// Its acquire, sent again as it was first sent.
	r := acquire(waiter)
	require.True(t, r.Granted)
	assert.Equal(t, "a:1", r.Upstream, "the re-sent acquire names no upstream: the request runs on the old route's "+
		"upstream while Redis counts it on a")

	// A requeue sent again after its grant (a refused request waits again
	// and is granted at once; the reload comes between the call and its
	// retry) answers its upstream too.
	require.NoError(t, s.Release(ctx, fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: pool}))
	rq := fairqueue.RequeueArgs{TicketArgs: fairqueue.TicketArgs{ID: "n1:4", Node: "n1", Limits: pool, Cost: 1}, Old: "n1:3", Seq: 3}
	_, err = s.Requeue(ctx, rq)
	require.NoError(t, err)
	up, err := rdb.HGet(ctx, s.Tag()+":uheld", "n1:4").Result()
	require.NoError(t, err, "the requeued ticket granted at once")
	rq.Limits = plain
	res, err := s.Requeue(ctx, rq)
	require.NoError(t, err)
	require.True(t, res.Granted)
	assert.Equal(t, up, res.Upstream, "the re-sent requeue names no upstream")
}
