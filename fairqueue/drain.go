package fairqueue

import (
	"context"
	"time"
)

// Drain stops admitting, answers every waiting Acquire of this node with
// ErrShuttingDown (removing it from the store), waits until every permit
// of this node is released or ctx ends, then leaves the queue: remaining
// permits are released in the store, and the background loop and the
// store's subscription stop. Nothing of this node stays in the store.
func (q *Queue) Drain(ctx context.Context) error {
	q.RejectWaiters()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for q.count(false) > 0 {
		select {
		case <-ctx.Done():
			return q.leave()
		case <-tick.C:
		}
	}
	return q.leave()
}

// RejectWaiters stops admitting and answers every waiting Acquire with
// ErrShuttingDown at once; held permits stay valid. It is the first half
// of Drain, for callers that wait for in-flight work elsewhere.
func (q *Queue) RejectWaiters() {
	q.mu.Lock()
	if !q.draining {
		q.draining = true
		close(q.drainCh)
	}
	q.mu.Unlock()
	// The fallback queue's waiters too (it is created under localMu and
	// checks draining then, so none is missed).
	q.localMu.Lock()
	defer q.localMu.Unlock()
	if q.local != nil {
		q.local.RejectWaiters()
	}
}

// Close is Drain without waiting for held permits: waiters are answered,
// and permits still held are released in the store. An Acquire (or a
// Permit.Requeue) whose store call is still on its way when the node
// leaves is answered with ErrShuttingDown too: the leave waits for that
// call (bounded by the store client's timeouts), so that it cannot reach
// the store after the leave. Drain and Close run once: a later or
// concurrent call returns when the first has left, with its error.
func (q *Queue) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.Load().StoreTimeout)
	defer cancel()
	q.RejectWaiters()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for q.count(true) > 0 {
		select {
		case <-ctx.Done():
			return q.leave()
		case <-tick.C:
		}
	}
	return q.leave()
}

// beforeLeave runs f, a store call made for a request (an acquire, a
// requeue), so that it ends before the node leaves: leave waits for it,
// as for a background call, and a call that reached the store after the
// last node's leave deleted the queue's keys would create some again, for
// nobody. Once the node is leaving it runs nothing and returns
// errClosed, as it does when the node began to leave while f was on its
// way: f's ticket is the leave's to end (its permit, if f was granted
// one, is released with the node's others).
func (q *Queue) beforeLeave(f func() error) error {
	q.bgMu.Lock()
	if q.closed.Load() {
		q.bgMu.Unlock()
		return errClosed
	}
	q.bg.Add(1)
	q.bgMu.Unlock()
	defer q.bg.Done()
	err := f()
	if q.closed.Load() {
		return errClosed
	}
	return err
}

func (q *Queue) count(pendingOnly bool) int {
	w, h := q.census()
	w += int(q.ending.Load()) // rejected, their cancels still on their way
	if pendingOnly {
		return w
	}
	return w + h
}

// leave is the end of Drain and Close, once: a call that comes while
// another leaves waits for it (its caller may close the store's client
// when it returns) and returns its error.
func (q *Queue) leave() error {
	if !q.closed.CompareAndSwap(false, true) {
		<-q.left
		return q.leaveErr
	}
	var err error
	defer func() {
		q.leaveErr = err
		close(q.left)
	}()
	joined := q.s.end()
	// Background calls (each bounded by the store timeout) end before the
	// leave: a cancel that ran after the last node's leave deleted the
	// queue's keys would create some again. closed is set: no background
	// call starts after this.
	q.bgMu.Lock()
	q.bgMu.Unlock()
	q.bg.Wait()
	if joined {
		err = q.s.leave()
	}
	q.localMu.Lock()
	if q.local != nil {
		_ = q.local.Close()
	}
	for _, r := range q.retired {
		_ = r.Close()
	}
	q.localMu.Unlock()
	if !joined {
		// The store was never opened for this node (or refused it: a
		// redisstore.Store another Queue has open): it is not this
		// Queue's to close.
		return err
	}
	if cerr := q.store.Close(); err == nil {
		err = cerr
	}
	return err
}

// Stats is a node's view of its queue.
type Stats struct {
	// Waiting is the number of this node's tickets waiting, those in
	// its fallback queue (Config.Fallback, while the store is down)
	// included.
	Waiting int
	// InFlight is the number of this node's permits held.
	InFlight int
	// StoreUp is the store's up/down state.
	StoreUp bool
	// StoreRefused, while the store is down for refusing this node's
	// user a permission (Redis's NOPERM: an ACL), is that refusal and
	// what the user needs (PermissionNeeder); "" otherwise.
	StoreRefused string
	// Grants is the highest grant counter of the queue seen.
	Grants int64
	// Cluster is the whole queue as the store reported it at this node's
	// last heartbeat (zero before the first).
	Cluster ClusterView
}

// Stats returns this node's view of the queue.
func (q *Queue) Stats() Stats {
	w, h := q.census()
	// A request waiting in the fallback queue has no ticket here until
	// it is granted (unavailable): count it where it waits.
	q.localMu.Lock()
	if q.local != nil {
		lw, _ := q.local.census()
		w += lw
	}
	q.localMu.Unlock()
	up, refused := q.health.state() // one read: a refusal only with the store down
	st := Stats{Waiting: w, InFlight: h, StoreUp: up, StoreRefused: refused, Grants: q.grants.Load()}
	if c := q.s.cluster.Load(); c != nil {
		st.Cluster = *c
	}
	return st
}
