// Package fairqueue is a cluster-wide fair permit queue: N permits shared
// by every process ("node") that opens the same named queue in the same
// Store, handed out in arrival order, with waiters parked until a permit
// frees anywhere in the cluster. It knows nothing of HTTP or Caddy.
//
// # Model
//
// A node calls Queue.Acquire for each unit of work (an LLM request). The
// call mints a ticket ID ("<node>:<counter>", the node ID random per
// Queue), registers the local waiter, and only then asks the store, in
// one call: a free permit with nobody waiting is granted at once (the
// fast path); otherwise the ticket joins the queue, ordered by the
// store's own arrival counter, never by node clocks. With Config.Fair,
// each flow (a tenant in one priority band) is FIFO and the flow with
// the least usage is served next (see Config.Fair and Permit.Charge).
//
// When a permit is released, the same store call pops the head of the
// queue, makes it the holder and notifies only that ticket's node, which
// wakes only that waiter (the handoff). There is no broadcast to every
// waiter and no per-ticket poller. Because notifications can be lost
// (Redis Pub/Sub is at most once), each node with waiters reconciles
// once per poll interval and after every re-subscription: one call that
// lists the node's holders (at most the permits) and dispatches permits
// freed by expired leases.
//
// A ticket moves from pending to exactly one of granted, timed out,
// cancelled (its context ended) or rejected (drain) by one compare-and-
// set. A grant that loses that race is given back by the ticket's own
// cleanup, so no permit leaks.
//
// Held permits have leases (Config.Lease), renewed by one heartbeat per
// node per Lease/3 that names the permits the node really holds. A node
// that dies stops renewing: its permits return when their leases end and
// its waiters are dropped from the queue once its liveness (also Lease)
// ends. A store that lost its data (Redis restarted empty) is detected by
// its epoch: heartbeats then re-register live holders and reinstate
// waiters; until every node's heartbeat has run (at most Lease/3), more
// than Permits may run at once.
//
// A node's life in the cluster is its session (after etcd's
// concurrency.Session): it joins the queue at the first Acquire, runs the
// node's one background goroutine (heartbeats and reconciles, acting on
// events the rest of the Queue notes: a failed call, a new subscription,
// a changed data set or lease, a failed transfer) and leaves at Drain or
// Close. The Queue keeps the tickets and their waits.
//
// When the store cannot be reached, Acquire never blocks past the max
// wait: store calls are bounded, and after Config.DownAfter consecutive
// failures the store is marked down and Acquire answers at once, with
// ErrStoreUnavailable or, with Config.FailOpen, a permit that the next
// successful heartbeat registers in the store.
//
// # Stores
//
// The Redis store (package redisstore) shares a queue across processes;
// the in-process store (package memstore) serves one process. Both pass
// the same conformance suite (package storetest).
package fairqueue
