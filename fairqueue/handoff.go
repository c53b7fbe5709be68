package fairqueue

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/headsttl"
)

// The local handoff. With a store shared by many nodes, handing a
// permit on costs a store round trip before the next request can start
// (the release, and a message to the waiter's node): on a busy machine
// most of the time between two requests on one permit. When the waiter
// that heads the queue is one of this node's own, and the store said so
// (Heads, from the reply of an earlier release or transfer), the node
// starts it at once on the permit of the request that just ended and
// tells the store afterwards (Transferrer). The permit stays counted in
// the store under the old holder until the transfer counts the waiter
// instead. Nobody is passed over: a ticket at the head of the queue
// stays there until it is granted or cancelled, since every later
// arrival queues behind it; the store names the node's first waiters
// in a row, and each is the head once those before it have gone, so
// requests that end before the next reply hand on to them in turn,
// their transfers sent in that order. Where that could fail, the node hands on
// through the store: fair queueing, tokens or an upstream pool (here, or in use
// by another node: its requeue puts a ticket back at its arrival), more
// permits held than the permits (a lowered setting), a learned capacity
// with other nodes in the queue (any node's report may lower the share,
// and a node hears of a share from its own reports only; heads named
// while the node was alone serve for HeadsTTL only, and the store lowers
// the share on another node's report no sooner than HeadsTTL after it
// last named heads), and any doubt that
// the store still holds the node alive with its waiters (not confirmed
// by a heartbeat for half a lease, a new subscription, a changed data
// set, waiters found missing: a waiter reinstated is at the tail, and
// never handed on to locally).

// headTickets are the node's waiters that head the queue, in order, and
// the permits setting under which the store chose them. The local
// handoffs take them one after the other (next): once the first has
// gone (granted, by the node or by the store, or cancelled) the second
// heads the queue, and so on, so permits that end back to back, before
// the store's next reply, each hand on locally.
type headTickets struct {
	ts      []*ticket
	permits int
	sent    time.Time    // when the call whose reply named them was sent
	next    atomic.Int32 // the index of the first not yet taken
}

// HeadsTTL is how long, under a learned capacity (Config.Adaptive), the
// heads a store's reply named serve local handoffs, from when the call
// was sent. A store names them only while the node is alone in the
// queue, and while heads it named may still serve, lowers the queue's
// learned share on no report of another node (Adapter): the share a
// newcomer lowers never meets heads named before it joined, which the
// node would hand on to before its next heartbeat shows it the
// newcomer. The node's own report may lower it: the reply tells the
// node, which then drops heads chosen before (inForceAt); a report
// that fails, its reply perhaps lost, drops them too (doubtHeads). Where no
// heads were named that recently, joins hold no lowering back. A node
// whose releases come further apart than this hands on through the
// store, which names the heads again.
const HeadsTTL = time.Second

// handoffs orders the local handoffs: the node takes the heads and
// sends their transfers one after the other, in the order it started
// the waiters, so the store sees the waiters granted in queue order
// (each is at the head, or follows only waiters started before it,
// when its transfer arrives) and numbers their grants in that order.
// One sender at a time (sending): the handOn whose transfer finds none
// on its way sends it, and a goroutine of its own then sends those the
// others queued behind it meanwhile (pending); they return at once.
type handoffs struct {
	mu      sync.Mutex
	pending []transfer
	sending bool
}

// transfer is a local handoff the store has not heard of yet: holder
// args.ID's permit now runs waiter t.
type transfer struct {
	args TicketArgs
	t    *ticket
}

// Heads implements HeadListener: the store says which of this node's
// tickets head the queue, in order (none: another node's does), chosen
// under permits by a call sent at sent.
func (q *Queue) Heads(ids []string, permits int, sent time.Time) {
	ts := make([]*ticket, 0, len(ids))
	for _, id := range ids {
		// One the node has forgotten ended (cancelled): its cancel is
		// on its way, and the next one heads the queue once it lands.
		if t := q.lookup(id); t != nil {
			ts = append(ts, t)
		}
	}
	q.ho.mu.Lock()
	defer q.ho.mu.Unlock()
	if at := int64(sent.Sub(q.s.base)); len(ts) == 0 || at <= q.s.reloaded || at <= q.learn.failed.Load() {
		// None, or chosen under the settings before a reload (the call
		// was sent before it): the store applies the new ones, which
		// may allow fewer (a learned capacity turned on, whose share
		// the node has not heard of yet); or sent before a report of
		// the node's failed (doubtHeads).
		q.s.head.Store(nil)
		return
	}
	q.s.head.Store(&headTickets{ts: ts, permits: q.inForceAt(permits, sent), sent: sent})
}

// doubtHeads drops the heads after a report of the node's own failed
// (Adapter): the call may have run and its reply been lost, the share
// lowered in the store, and the node hears of a share from its reports'
// replies only: it would hand on above it, up to HeadsTTL. Heads named
// by a call sent before now are dropped too (Heads): the store may have
// chosen them before the report ran. The next reply names heads under
// the share in force.
func (q *Queue) doubtHeads() {
	q.ho.mu.Lock()
	defer q.ho.mu.Unlock()
	q.learn.failed.Store(int64(time.Since(q.s.base)))
	q.s.head.Store(nil)
}

// inForceAt is inForce for heads named by a call sent at sent: where the
// node heard of other shares after it sent the call, the store may have
// chosen them under the shares before (its reply read late, after that
// of a report that ran later), so they count as chosen under all the
// permits, and a share lowered meanwhile stops the local handoffs
// (takeHead).
func (q *Queue) inForceAt(permits int, sent time.Time) int {
	in := q.inForce(permits)
	if q.learn.moved.Load() >= int64(sent.Sub(q.s.base)) {
		return permits
	}
	return in
}

// inForce is permits under the learned share in force as the store last
// said (Config.Adaptive): a share lowered since a reply named the heads
// stops the local handoffs, as a lowering reload does.
func (q *Queue) inForce(permits int) int {
	m := q.learn.shares.Load()
	if cfg := q.cfg.Load(); cfg.Adaptive == nil || m == nil {
		return permits
	}
	return Limits{Permits: permits, Learned: true}.Scale(*m).Permits
}

// Woken counts the grants that have woken a waiter of this node so far:
// from the store (a release's reply, a Pub/Sub message, a grant found by
// reconcile) or by a local handoff. A caller that sees it move across
// its Release knows a waiter is ready to run (a concurrent grant may
// move it too).
func (q *Queue) Woken() uint64 { return q.s.woken.Load() }

// HeadIsOwn reports whether the store last said that one of this node's
// waiters heads the queue (and no local handoff has taken the list it
// said so in to its end): a release now would likely start one at once
// (a local handoff) instead of making a store round trip first.
func (q *Queue) HeadIsOwn() bool {
	h := q.s.head.Load()
	return h != nil && int(h.next.Load()) < len(h.ts)
}

// takeHead grants the node's waiter that heads the queue, if the store
// named one under no more than permits, and returns it (nil if none).
// Waiters named before it that have left since (granted, or cancelled)
// are passed: the next one heads the queue in their place once their
// grants or cancels reach the store, and its transfer is sent after
// theirs. Not a waiter whose transfer failed: the store may still have
// it waiting, and would number a grant behind it first; the list is
// dropped instead. With ho.mu held: the takes are in queue order, and
// so are the transfers queued in the same hold.
func (q *Queue) takeHead(permits int) *ticket {
	h := q.s.head.Load()
	if h == nil {
		return nil
	}
	if h.permits > permits {
		// The store chose them under more permits than the settings now
		// allow (a reply that crossed a lowering reload): a transfer
		// would keep the old concurrency, where the store's dispatch
		// applies the new permits.
		q.s.head.CompareAndSwap(h, nil)
		return nil
	}
	if q.cfg.Load().Adaptive != nil && time.Since(h.sent) >= headsttl.Of(HeadsTTL) {
		// Named while the node was alone in the queue, longer ago than
		// the store vouches for the learned share: a node that joined
		// since may have lowered it, before the heartbeat that would
		// show it to this one.
		q.s.head.CompareAndSwap(h, nil)
		return nil
	}
	for {
		i := int(h.next.Load())
		if i >= len(h.ts) {
			return nil
		}
		h.next.Store(int32(i + 1))
		t := h.ts[i]
		if t.reinstated.Load() || t.unsent.Load() {
			// Queued again at the tail: the store lost it, and may have
			// lost the order; or started here by a transfer that failed:
			// the store may still have it waiting. No more local
			// handoffs on this word.
			q.s.head.CompareAndSwap(h, nil)
			return nil
		}
		if t.state.Load() != statePending {
			// Granted or cancelled already (a reply may name again a
			// waiter a transfer on its way has started): its move, if
			// any, is not this call's to end.
			continue
		}
		// Moving before granted: a heartbeat's snapshot that sees the
		// grant sees the move too, and leaves the waiter to its
		// transfer (the transfer, or its failure, ends the move).
		t.moving.Store(true)
		if t.state.CompareAndSwap(statePending, stateGranted) {
			return t
		}
		t.moving.Store(false)
	}
}

// handOn hands the permit released by args straight to the node's
// waiter at the head of the queue, if the local handoff applies (see
// above), and records the move in the store. It reports whether it did;
// if not, the caller releases the permit in the store.
func (q *Queue) handOn(args TicketArgs) bool {
	tr, ok := q.store.(Transferrer)
	cfg := q.cfg.Load()
	if !ok || cfg.Fair || len(cfg.Upstreams) > 0 || cfg.KVTokens > 0 || !q.health.up() || !q.s.alive() ||
		q.isDraining() || (cfg.Adaptive != nil && q.s.shared()) {
		return false
	}
	// A background call: Close waits for it before the node leaves.
	q.bgMu.Lock()
	if q.closed.Load() {
		q.bgMu.Unlock()
		return false
	}
	q.bg.Add(1)
	q.bgMu.Unlock()
	defer q.bg.Done()
	q.ho.mu.Lock()
	t := q.takeHead(q.inForce(cfg.limits().Permits))
	if t == nil {
		q.ho.mu.Unlock()
		return false
	}
	t.woken.Store(time.Now().UnixNano())
	t.registered.Store(true)
	t.grantPermits.Store(int64(cfg.limits().Permits))
	close(t.granted)
	x := transfer{args: args, t: t}
	queued := q.ho.sending
	if queued {
		// The transfer on its way goes first; its sender sends this one
		// after it (and Close waits for that sender).
		q.ho.pending = append(q.ho.pending, x)
	}
	q.ho.sending = true
	q.ho.mu.Unlock()
	if o := cfg.Observer; o != nil && t.handoff.CompareAndSwap(false, true) {
		o.Handoff(0)
	}
	q.s.woken.Add(1)
	if queued {
		return true
	}
	// Let the waiter run before the transfer's round trip: otherwise it
	// waits for this goroutine to park in the store call.
	runtime.Gosched()
	failed := !q.transfer(tr, x)
	if x, ok := q.nextTransfer(); ok {
		// Others queued theirs meanwhile: a goroutine of its own sends
		// them, so that this caller's Release does not wait for them.
		// Close waits for it (this call's count holds bg above zero).
		q.bg.Add(1)
		go func() {
			defer q.bg.Done()
			q.sendTransfers(tr, x, failed)
		}()
	}
	return true
}

// nextTransfer takes the first transfer queued, or ends the sending
// (ok false) when none is.
func (q *Queue) nextTransfer() (x transfer, ok bool) {
	q.ho.mu.Lock()
	defer q.ho.mu.Unlock()
	if len(q.ho.pending) == 0 {
		q.ho.sending = false
		return x, false
	}
	x = q.ho.pending[0]
	q.ho.pending = slices.Delete(q.ho.pending, 0, 1)
	return x, true
}

// sendTransfers sends x and then the transfers queued behind it, in
// order, until none is left; after a failure (failed: one before x) the
// rest go as plain releases.
func (q *Queue) sendTransfers(tr Transferrer, x transfer, failed bool) {
	for ok := true; ok; x, ok = q.nextTransfer() {
		if failed {
			q.transferFailed(x)
		} else {
			failed = !q.transfer(tr, x)
		}
	}
}

// handingOn reports whether a transfer of holder id's permit waits in
// the queue: the store counts id as a holder once the transfers before
// it land (id's waiter ended before its own transfer was sent), and
// that transfer takes the entry out, or releases it if it fails.
func (q *Queue) handingOn(id string) bool {
	q.ho.mu.Lock()
	defer q.ho.mu.Unlock()
	for _, x := range q.ho.pending {
		if x.args.ID == id {
			return true
		}
	}
	return false
}

// transfer tells the store of local handoff x; it reports whether the
// store answered. It goes under the settings in force as it is sent,
// not those its release read: queued behind others, it may go out round
// trips later, after a reload, and where its waiter was granted
// meanwhile it dispatches the freed permit (inForceNow).
func (q *Queue) transfer(tr Transferrer, x transfer) bool {
	q.inForceNow(&x.args)
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.Load().StoreTimeout)
	defer cancel()
	err := tr.Transfer(ctx, x.args, x.t.id)
	q.health.record(q.log, err)
	if err != nil {
		q.transferFailed(x)
		return false
	}
	x.t.moving.Store(false)
	if q.cfg.Load().Lease != x.args.Lease {
		// The transfer wrote the waiter's entry with the lease it
		// carried, and a reload changed the lease since:
		// the heartbeat that change sent at once left the waiter to its
		// transfer (it was moving). Renew it now, under the lease in force,
		// not a third of the new lease from then (past the old one).
		q.s.note(evResync, true)
	}
	return true
}

// transferFailed gives up telling the store of local handoff x: a
// transfer failed (this one, or one before it, which the ones queued
// behind it do not wait on: each would wait as long).
func (q *Queue) transferFailed(x transfer) {
	// No local handoff passes its waiter: not on the list that named it
	// (dropped), nor on one a later reply makes (takeHead).
	x.t.unsent.Store(true)
	q.ho.mu.Lock()
	q.s.head.Store(nil)
	q.ho.mu.Unlock()
	defer x.t.moving.Store(false)
	// The move may not have reached the store: release the old holder
	// as a release would have (its dispatch then grants the waiter, who
	// holds its permit already). The waiter, held here, is counted again
	// by the next heartbeat if the store does not have it. The transfer
	// may still run late, after the waiter ended: reconcile for a while
	// finds such a ghost holder.
	q.s.note(evVerify|evSweep, true)
	q.releaseAsync(x.args.ID)
}
