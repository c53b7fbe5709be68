package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A requeue's copy that reaches the store after the new ticket it queued
// was granted and released (go-redis sends a command again after a read
// timeout, on another connection, and the first send may run last).
func init() {
	cases = append(cases,
		testCase{"RequeueSentAgainAfterItsTicketEndedQueuesNothing", requeueLateCopy},
		testCase{"RequeueSentAgainAfterItsCooldownEndedCoolsNothing", requeueLateCopyCools},
		testCase{"RequeueSentAgainThatGrantsItsTicketAnswersGranted", requeueAgainGrants},
		testCase{"AcquireOfARequeuedTicketComingLateQueuesNothing", acquireAfterRequeue},
	)
}

// The late copy finds that its requeue ran (the old ticket was given
// back by it): it queues the new ticket for nobody no more, in either
// store, and the next waiter is granted the free permit at once.
func requeueLateCopy(t *testing.T, h Harness) {
	s := store(t, h, "requeuelate", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	rq := fairqueue.RequeueArgs{TicketArgs: ticket("n1:2", "n1", l), Old: "n1:1", Seq: 1}
	_, err = s.Requeue(bg, rq) // n1:2 is granted the permit n1:1 gave back
	require.NoError(t, err)
	require.NoError(t, s.Release(bg, ticket("n1:2", "n1", l)))

	_, err = s.Requeue(bg, rq) // the late copy
	require.NoError(t, err)
	waiting, holders := h.State(t, "requeuelate")
	assert.Empty(t, waiting, "waiting after the late copy (n1:2 ended before it)")
	assert.Empty(t, holders, "holding after the late copy (n1:2 ended before it)")
	res, err = s.Acquire(bg, ticket("n1:3", "n1", l))
	require.NoError(t, err)
	assert.True(t, res.Granted, "the next waiter gets the permit nobody holds")
	require.NoError(t, s.Release(bg, ticket("n1:3", "n1", l)))
	require.NoError(t, s.Leave(bg, "n1", l))
}

// The late copy of a requeue that cooled its upstream, reaching the
// store after that cooldown ended, cools it no more: it is told from a
// first send (the tombstone of the old ticket), and the upstream serves
// the next waiter at once.
func requeueLateCopyCools(t *testing.T, h Harness) {
	s := store(t, h, "requeuelatecool", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	rq := fairqueue.RequeueArgs{TicketArgs: ticket("n1:2", "n1", l), Old: "n1:1", Seq: 1}
	rq.Cool, rq.CoolFor = "a:1", time.Second
	_, err = s.Requeue(bg, rq) // n1:2 waits while a cools
	require.NoError(t, err)
	time.Sleep(1200 * time.Millisecond) // a's cooldown ended
	_, err = s.Acquire(bg, ticket("n1:3", "n1", l))
	require.NoError(t, err) // its dispatch grants n1:2, the head
	require.NoError(t, s.Release(bg, ticket("n1:2", "n1", l)))
	require.NoError(t, s.Cancel(bg, ticket("n1:3", "n1", l)))
	waiting, holders := h.State(t, "requeuelatecool")
	require.Empty(t, waiting)
	require.Empty(t, holders)

	_, err = s.Requeue(bg, rq) // the late copy
	require.NoError(t, err)
	res, err = s.Acquire(bg, ticket("n1:4", "n1", l))
	require.NoError(t, err)
	assert.True(t, res.Granted, "a is free and cools no more: the late copy cooled it again (or queued n1:2 again)")
	require.NoError(t, s.Release(bg, ticket("n1:4", "n1", l)))
	require.NoError(t, s.Leave(bg, "n1", l))
}

// A requeue sent again while its new ticket waits, whose dispatch grants
// that ticket (here: a reload added an upstream, which the copy carries),
// answers as the ticket then stands, granted, in either store.
func requeueAgainGrants(t *testing.T, h Harness) {
	s := store(t, h, "requeueagaingrants", "n1")
	l := fairqueue.Limits{Permits: 2, Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	rq := fairqueue.RequeueArgs{TicketArgs: ticket("n1:2", "n1", l), Old: "n1:1", Seq: 1}
	rq.Cool, rq.CoolFor = "a:1", time.Minute
	res, err = s.Requeue(bg, rq)
	require.NoError(t, err)
	require.False(t, res.Granted, "a cools")
	rq.Limits.Upstreams = append(rq.Limits.Upstreams, fairqueue.Upstream{Dial: "b:1", Permits: 1})
	res, err = s.Requeue(bg, rq) // sent again, after a reload added b
	require.NoError(t, err)
	assert.True(t, res.Granted, "n1:2 was granted on b by the call sent again: %+v", res)
	assert.Equal(t, "b:1", res.Upstream)
	require.NoError(t, s.Release(bg, ticket("n1:2", "n1", rq.Limits)))
	require.NoError(t, s.Leave(bg, "n1", rq.Limits))
}

// An acquire's copy that reaches the store after its ticket was granted
// and requeued (its first send, late: go-redis sent it again after a
// read timeout) finds the tombstone the requeue left, and queues the
// ticket no more, for a request that waits as the requeue's ticket.
func acquireAfterRequeue(t *testing.T, h Harness) {
	s := store(t, h, "acquireafterrequeue", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	_, err = s.Requeue(bg, fairqueue.RequeueArgs{TicketArgs: ticket("n1:2", "n1", l), Old: "n1:1", Seq: 1})
	require.NoError(t, err)
	require.NoError(t, s.Release(bg, ticket("n1:2", "n1", l)))

	res, err = s.Acquire(bg, ticket("n1:1", "n1", l)) // the late copy
	require.NoError(t, err)
	assert.True(t, res.Gone, "the late copy's answer: %+v", res)
	waiting, holders := h.State(t, "acquireafterrequeue")
	assert.Empty(t, waiting, "waiting after the late copy")
	assert.Empty(t, holders, "holding after the late copy")
	require.NoError(t, s.Leave(bg, "n1", l))
}
