package fairqueue

import (
	"context"
	"time"
)

// Store keeps the shared state of one named queue: who holds a permit,
// who waits and in what order, which nodes are alive. Every Queue (node)
// that opens the same queue in the same store shares its permits.
//
// Every method must be idempotent by ticket ID: a call may be sent twice
// (a client retry after a lost answer) and must leave the same state.
// Methods that change holders also dispatch: while permits are free they
// grant the head of the queue and notify its owner node through the
// Listener that node registered with Open.
type Store interface {
	// Open registers node's Listener. When Open returns nil, every grant
	// made for one of node's tickets afterwards reaches h.Granted (or is
	// found by a later Reconcile).
	Open(ctx context.Context, node string, h Listener) error
	// Acquire grants t at once when a permit is free and nobody waits
	// (the fast path), or puts it in the queue.
	Acquire(ctx context.Context, t TicketArgs) (AcquireResult, error)
	// Release gives back t's permit, if t holds one, and dispatches.
	Release(ctx context.Context, t TicketArgs) error
	// Cancel removes t from the queue, leaves a tombstone so that a
	// late Acquire of t does nothing, and releases t's permit if t was
	// granted meanwhile, its flow's counter corrected by t.Correction.
	Cancel(ctx context.Context, t TicketArgs) error
	// Heartbeat renews node's liveness and the leases of the permits it
	// holds, records node's lease (every grant to node's waiters, by any
	// node, expires after it), and reports which of the pending tickets
	// it names the store has neither queued nor granted.
	Heartbeat(ctx context.Context, hb HeartbeatArgs) (HeartbeatResult, error)
	// Reconcile dispatches permits freed by lease expiry and returns the
	// tickets of node that hold a permit.
	Reconcile(ctx context.Context, node string, limits Limits) (ReconcileResult, error)
	// Requeue gives back the permit of t.Old (if it still holds one) and
	// queues the new ticket t.ID at t.Old's arrival place t.Seq, in one
	// step, then dispatches: an upstream refused the request (see
	// Permit.Requeue). It answers as Acquire does (the new ticket may be
	// granted at once); no queue cap applies. Idempotent by both tickets.
	Requeue(ctx context.Context, t RequeueArgs) (AcquireResult, error)
	// Leave removes node: its permits are released, its liveness entry
	// deleted, and dispatch runs.
	Leave(ctx context.Context, node string, limits Limits) error
	// Close stops delivering grants to the Listener and frees resources.
	// A Queue calls it as it closes, if Open returned nil for its node.
	Close() error
}

// Listener receives a node's notifications from the Store.
type Listener interface {
	// Granted is called with the IDs of tickets of this node that were
	// granted a permit by another call (a release, a cancel, a
	// reconcile). It must not block.
	Granted(grants ...Grant)
	// Resynced is called when notifications may have been lost (the
	// subscription was re-established); the node reconciles at once.
	Resynced()
}

// Transferrer is a Store that takes local handoffs: a node whose own
// waiter heads the queue, as the store told it (HeadListener), starts that
// waiter on the permit of a request that just ended, before any store
// call, and then records the move with Transfer. A node sends its
// transfers one after the other, in the order it started the waiters. The move keeps the
// permits counted in the store at least those in use: the holder's entry
// goes only as the waiter's is added. Queues with fair queueing, an
// upstream pool or tokens (Limits.Tokens) do not hand on locally (another
// ticket may come first, or the waiter may not fit).
type Transferrer interface {
	// Transfer gives holder t.ID's permit to t.Node's waiting ticket to,
	// in one step, then dispatches if the permit was left free (to was
	// granted meanwhile by another call). to counts as a holder
	// afterwards in any case: it runs. Idempotent.
	Transfer(ctx context.Context, t TicketArgs, to string) error
}

// HeadListener is a Listener that a Transferrer tells, after its releases
// and transfers, which of the node's tickets head the queue: heads, in
// order (none if another node's ticket heads it), are the first to be
// served, in every node's order, each until it is granted or cancelled,
// and each the head once those before it have gone. permits is the
// Limits.Permits of the call whose reply named them: they were chosen
// under that setting. sent is when that call was sent (before the store
// ran it), or its TicketArgs.LimitsRead if earlier: under a learned
// capacity the heads serve for HeadsTTL from then.
type HeadListener interface {
	Heads(tickets []string, permits int, sent time.Time)
}

// TokenPasses bounds how many grants in a row, in fair order, may pass
// a ready flow whose head does not fit the free tokens (Limits.Tokens),
// or whose head is a waiter of another node without a pool that cannot
// be placed (it needs room on every upstream of the pool: a rolling
// change that adds one): then dispatch waits until the head fits. So a
// heavy request at the front of the fair order waits for at most
// TokenPasses lighter grants and the end of requests already running.
const TokenPasses = 8

// IdleFlows bounds the idle usage counters a store keeps per queue (fair
// queueing): a flow that leaves above the virtual time is remembered, so
// that coming back is no fresh start, until the virtual time passes it.
// Where the tenants are many and each comes once (a tenant taken from a
// value the client can vary), the virtual time may never pass them;
// beyond IdleFlows the counters nearest the virtual time, which carry
// the least usage above the others, are forgotten first.
const IdleFlows = 4096

// Grant is one permit handed to a waiting ticket.
type Grant struct {
	Ticket string
	// No is the queue's grant counter at this grant: grants of one queue
	// are numbered 1, 2, 3, ... in the order the store made them. 0 when
	// unknown (a grant found by Reconcile).
	No int64
	// At is when the store made the grant (its own clock); zero when
	// unknown.
	At time.Time
	// Upstream is the pool upstream the grant is for (Limits.Upstreams);
	// "" when the queue has no pool.
	Upstream string
	// Permits is the permits setting of the call that made the grant
	// (Limits.Permits, before a learned share): the grant counted the
	// holders against it. 0 when unknown (a grant found by Reconcile,
	// or one from a node of an earlier version).
	Permits int
}

// Limits are the settings every store call carries; the config of the
// node making the call applies (there is no cluster-wide config).
type Limits struct {
	Permits int
	Lease   time.Duration
	// MaxQueue caps the tickets waiting (all nodes); 0: no cap.
	MaxQueue int
	// MaxQueuePerTenant caps one tenant's tickets waiting; 0: no cap.
	MaxQueuePerTenant int
	// MaxInFlightPerTenant caps the permits one tenant holds (all
	// nodes, all priority bands; fair tickets only); 0: no cap.
	MaxInFlightPerTenant int
	// Tokens is the KV-cache tokens all holders may hold together
	// (Config.KVTokens): a grant needs room for its ticket's
	// TicketArgs.Tokens; 0: not counted; -1: counted, and no room at all
	// (every token is reserved, see Config.ReservedTokens). A FIFO head that does not fit
	// waits for room and nothing passes it; in fair order, a ready flow
	// whose head fits may pass one whose head does not, at most
	// TokenPasses times in a row.
	Tokens int
	// TokenBound is the most one ticket weighs against Tokens (and an
	// upstream's KVTokens): Config.ClampTokens' bound, the configured
	// capacity, not less the reserved tokens (a ticket waits for those to
	// end rather than count lighter). 0: Tokens, and the largest
	// upstream's KVTokens when every upstream sets one.
	TokenBound int
	// Learned: the store grants under its learned share of these limits
	// (Config.Adaptive, Adapter; Limits.Scale).
	Learned bool
	// Upstreams is the pool (Config.Upstreams): every grant names one,
	// with free permits and not cooling, and none holds more than its
	// Permits; Permits caps them all together. Empty: no pool.
	Upstreams []Upstream
	// TenantsOutside counts, by tenant (a fair ticket's flow less its
	// priority band: TicketFlow up to its last '.'), the permits held
	// outside the store that MaxInFlightPerTenant caps too: in a fallback
	// queue's calls (Config.Fallback), the node's requests the shared
	// store granted that still run. memstore counts them beside its own
	// holders; nil: none.
	TenantsOutside map[string]int
}

// TicketArgs identifies a ticket in a store call. A ticket ID is
// "<node>:<counter>", or "<node>:<counter>:<tenant>" when the queue is fair
// across tenants: the store orders it by tenant (see Config.Fair).
type TicketArgs struct {
	ID   string
	Node string
	Limits
	// Tombstone asks Cancel to leave a short-lived mark so that an
	// Acquire of the same ticket reaching the store later does nothing.
	// Needed only when the ticket's Acquire got no answer. On Release,
	// Transfer (the holder) and Requeue (RequeueArgs.Old), it marks the
	// ticket given back for a lease, so that a Heartbeat of the node sent
	// before it, naming the ticket held, does not count it again when it
	// reaches the store later: set it while such a heartbeat may be on
	// its way.
	Tombstone bool
	// Cost is the ticket's estimated cost divided by its tenant's weight
	// (and PriorityFactor to the power of its band): what its grant adds
	// to its flow's usage counter (fair queueing).
	Cost float64
	// Tokens is the ticket's weight against Limits.Tokens (and its
	// upstream's Upstream.KVTokens): Request.Tokens, clamped. Carried by
	// Acquire and Requeue (the new ticket); 0: weighs nothing.
	Tokens int
	// Asks, with Tokens, is Request.Tokens unclamped where it is above
	// Tokens (0: Tokens): a store call whose limits count tokens
	// (Limits.Tokens) weighs the ticket it grants by Asks, bounded by the
	// capacity in force then (its Limits.TokenBound), so a waiter queued
	// clamped to a smaller capacity that a reload raised is granted at
	// its full weight, and nothing that fits beside its old weight only
	// passes it; a call that counts no tokens counts Tokens.
	Asks int
	// Correction, on Release, is what the ticket really used minus Cost,
	// in the same units: added to its flow's usage counter when the
	// permit is released (0: the estimate stands). On Cancel, it is
	// added likewise when the cancel finds t granted (a grant nobody
	// used: minus its Cost takes the charge back), and ignored otherwise.
	Correction float64
	// Cool, on Release (and Requeue), names an upstream that failed the
	// request: dispatch leaves it out for CoolFor, across the cluster.
	Cool    string
	CoolFor time.Duration
	// LimitsRead, on Release and Transfer, is when the node read Limits
	// (its settings) for the call: the heads its reply names
	// (HeadListener) count as named by a call sent then, under the
	// settings of then, for a reload may land between the read and the
	// call. Zero: when the call is sent.
	LimitsRead time.Time
}

// AcquireResult is the answer to Store.Acquire.
type AcquireResult struct {
	// Granted: the ticket holds a permit now.
	Granted bool
	// Gone: the ticket was cancelled before this call reached the store.
	Gone bool
	// Full: a queue length cap refused the ticket; nothing was changed.
	Full bool
	// Seq is the arrival order the store assigned (1, 2, 3, ...).
	Seq int64
	// GrantNo is the grant counter when Granted (see Grant.No).
	GrantNo int64
	// Position is the number of tickets ahead of this one plus one, when
	// queued.
	Position int
	// Grants is the queue's grant counter when the call ran, so that
	// later positions can be estimated from it without asking the store.
	Grants int64
	// Epoch identifies the store's data set (see HeartbeatArgs.Epoch).
	Epoch string
	// Upstream is the pool upstream of the grant when Granted.
	Upstream string
}

// HeartbeatArgs is one node's periodic renewal.
type HeartbeatArgs struct {
	Node string
	Limits
	// Held are the tickets that hold a permit on this node: their
	// leases are renewed. Re-added only when the store lost its data.
	Held []string
	// Adopt are permits admitted while the store was unreachable
	// (fail open): they are added as holders if missing.
	Adopt []string
	// Upstreams maps the Held and Adopt tickets that run on a pool
	// upstream to it, so that a holder the store re-adds or adopts counts
	// on its upstream too.
	Upstreams map[string]string
	// Tokens maps the Held and Adopt tickets that weigh tokens
	// (TicketArgs.Tokens) to their weight, so that a holder the store
	// re-adds or adopts counts its tokens too; and the Pending ones to the
	// weight they were queued with, so that a store that lost it (a key
	// evicted under maxmemory) records it again and reports the ticket
	// in HeartbeatResult.Missing (the node's acquire finds it queued).
	Tokens map[string]int
	// Pending are tickets of this node waiting for a grant, named when the
	// node has reason to doubt the store still has them (it was forgotten,
	// a call failed, the subscription was re-established), else the
	// oldest one alone (a key evicted under maxmemory gives no other
	// sign): the store reports those it lost in HeartbeatResult.Missing.
	Pending []string
	// Epoch is the data-set ID this node last saw ("" if none).
	Epoch string
	// Beat numbers the node's heartbeats (increasing, from 1): a
	// heartbeat sent again (a client retry) answers Rejoined as its first
	// run did.
	Beat uint64
}

// HeartbeatResult is the answer to Store.Heartbeat.
type HeartbeatResult struct {
	// Epoch is the store's current data-set ID.
	Epoch string
	// Rejoined: the store had forgotten this node since its last
	// heartbeat (it lost its data, the node was silent longer than its
	// lease, or an acquire brought it back): its waiting tickets may be
	// gone; the node names them (Pending) in its next heartbeat.
	Rejoined bool
	// Cluster is the queue as the store sees it.
	Cluster ClusterView
	// Readded lists the held tickets of the call whose holder entry was
	// missing and was added again: the store lost it (a restart, a
	// failover that lost the last writes) while the node was alive. A
	// ticket the node released while the call was on its way is among
	// them: the node releases it again.
	Readded []string
	// Missing lists the Pending tickets the store has neither queued nor
	// granted: the node reinstates them (queues them again).
	Missing []string
	// At is when the store ran the heartbeat (its own clock, as
	// Grant.At); zero when unknown. A grant made before it (Grant.At)
	// is that much older than the heartbeat: its lease may run out
	// that much sooner after the heartbeat than a lease.
	At time.Time
}

// ClusterView is a queue's state across every node.
type ClusterView struct {
	// Waiting is the number of tickets queued.
	Waiting int
	// Holders is the number of permits held.
	Holders int
	// TokensHeld is the KV-cache tokens the holders hold (Limits.Tokens).
	TokensHeld int
	// Nodes is the number of live nodes.
	Nodes int
	// Rank is the calling node's place, from 0, among the live nodes in
	// the order of their IDs (a heartbeat's answer): the part of the
	// capacity its fallback queue takes while the store is down.
	Rank int
	// HeldBy is, by the rank (Rank) of each live node, the permits of
	// Holders its tickets hold (TicketNode), and TokensBy their tokens
	// (of TokensHeld); both nil where no live node holds any. While the
	// store is down, each node's fallback queue takes what it held and
	// the free permits dealt to the nodes short of their part
	// (Config.LocalPermits).
	HeldBy, TokensBy []int
	// OnUpstreams is, by each upstream of the calling node's pool
	// (Limits.Upstreams), the permits held on it: a holder without an
	// upstream counts on every one, as dispatch counts it. nil without a
	// pool.
	OnUpstreams map[string]HeldOn
	// LeaseExpirations counts the permits freed because their lease ended
	// unrenewed (a crashed or partitioned node), since the queue's state
	// began.
	LeaseExpirations int64
	// At is when this node received the view (its heartbeat's answer);
	// zero in a store's reply.
	At time.Time
}

// HeldOn is the permits held on one upstream of a pool
// (ClusterView.OnUpstreams): All by every node, By by each live node's
// rank (nil where none holds any).
type HeldOn struct {
	All int
	By  []int
}

// ReconcileResult is the answer to Store.Reconcile.
type ReconcileResult struct {
	// Holders are this node's tickets that hold a permit.
	Holders []string
	// Upstreams maps the Holders granted on a pool upstream to it.
	Upstreams map[string]string
	// Grants is the queue's grant counter.
	Grants int64
	// Waiting is the queue length (all nodes).
	Waiting int
	// Epoch is the store's current data-set ID.
	Epoch string
}
