package fairqueue

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Defaults and limits of Config, the seed's numbers where it had them.
const (
	DefaultMaxWait      = 20 * time.Second
	DefaultPollInterval = 200 * time.Millisecond
	MinPollInterval     = 50 * time.Millisecond
	DefaultLease        = 30 * time.Second
	MinLease            = time.Second
	// DefaultStoreTimeout bounds a store call that is not bounded by a
	// request (release, cancel, heartbeat, reconcile).
	DefaultStoreTimeout = time.Second
	// MaxPermits bounds Config.Permits; it is the permits of a queue
	// bounded by KVTokens alone.
	MaxPermits = 1 << 20
	// DefaultPriorityFactor: each priority band is served 8 times as
	// often as the one below it when both are backlogged.
	DefaultPriorityFactor = 8
)

// Config configures one Queue (one node's view of one named queue).
type Config struct {
	// Name of the queue, for logs and errors.
	Name string
	// Permits is the number of tickets that may hold a permit at once,
	// across every node of the queue. Required, at least 1, unless
	// Upstreams are given: then it defaults to the sum of their permits
	// (and may lower it); the default caps nothing their own do not, so
	// a holder on an upstream a Reconfigure took out of the pool counts
	// on that upstream alone.
	Permits int
	// Upstreams is a pool of backends, each with its own permits: a grant
	// names the upstream its request goes to (Permit.Upstream), the one
	// with the most free permits relative to its size, ties to the one
	// granted longest ago; none ever runs more than its permits across
	// the cluster. An upstream that failed a request (Permit.Cool,
	// Permit.Requeue) is left out of dispatch for a cooldown. Every node
	// should list the same upstreams; the calling node's list applies.
	Upstreams []Upstream
	// MaxWait bounds how long Acquire waits. Default 20s, at least 50ms
	// (the smallest PollInterval).
	MaxWait time.Duration
	// PollInterval is how often a node with waiters reconciles with the
	// store (the safety net for lost notifications and expired leases).
	// Default 200ms, or MaxWait when that is shorter; at least 50ms and
	// at most MaxWait.
	PollInterval time.Duration
	// Lease is how long a permit stays held without renewal; nodes renew
	// their permits every Lease/3, and a node silent for Lease is dead.
	// Default 30s, at least 1s.
	Lease time.Duration
	// KVTokens is the KV-cache tokens the queue's holders may hold at
	// once, across every node: a grant needs room for its request's
	// Request.Tokens besides a free permit. 0: tokens are not counted.
	// With Upstreams, each upstream's own Upstream.KVTokens also applies
	// (KVTokens caps them all together; 0 here: their sum, if every one
	// sets it, which like Permits' caps nothing theirs do not; Validate
	// refuses 0 here with only some setting it).
	KVTokens int
	// Adaptive, when set, makes the queue learn its capacity from the
	// backend's time to first token (see Adaptive): the capacity in force
	// is a learned share of Permits, KVTokens and each upstream's, one
	// value for every node, kept by the store (an Adapter). The caller
	// reports what it sees with Queue.ObserveTTFT and ObserveRefused.
	Adaptive *Adaptive
	// Fair orders the queue fairly across tenants (Request.Tenant)
	// instead of strict arrival order: each flow (a tenant in one
	// priority band) has a usage counter, charged Request.Cost / weight
	// at each grant (and corrected by Permit.Charge at release); the
	// backlogged flow with the least usage is served next, ties by
	// arrival, FIFO inside each flow.
	Fair bool
	// PriorityFactor is how many times more often a priority band is
	// served than the band below it when both are backlogged (with
	// Fair). Default 8, at least 2.
	PriorityFactor float64
	// MaxQueue caps the number of tickets waiting across the cluster; a
	// ticket beyond it is refused at once with ErrQueueFull. 0: no cap.
	MaxQueue int
	// MaxQueuePerTenant caps the tickets of one tenant waiting in one
	// priority band (with Fair); beyond it, ErrQueueFull. 0: no cap.
	MaxQueuePerTenant int
	// MaxInFlightPerTenant caps the permits one tenant holds at once
	// across the cluster (all its priority bands; with Fair): its other
	// requests wait, and dispatch serves other tenants meanwhile. 0: no
	// cap.
	MaxInFlightPerTenant int
	// FailOpen admits a request without a permit when the store is
	// unreachable (Permit.FailOpen reports it); otherwise Acquire fails
	// with ErrStoreUnavailable.
	FailOpen bool
	// Fallback, when set, is an in-process store (memstore.New()) in which
	// requests queue in this node alone, with LocalPermits permits, while
	// the shared store is unreachable (instead of FailOpen or
	// ErrStoreUnavailable). The shared queue takes over again when the
	// store is back; fallback permits still running are then registered
	// there by the next heartbeat. A Reconfigure may pass another store
	// (or the same): the fallback queue in use keeps the one it opened
	// on, and so does the next one while a fallback queue of an outage
	// past still has a permit running (its store counts that permit); the
	// store passed is used from the first outage after they have ended.
	Fallback Store
	// LocalPermits is the fallback queue's permits; 0: this node's share
	// as of its last heartbeat: the permits it held then
	// (ClusterView.HeldBy) plus the permits free then (Permits less
	// ClusterView.Holders) dealt by deficit among the live nodes: each
	// node's plain part (parts that differ by at most one and add up to
	// Permits, in the order of their IDs: ClusterView.Rank) less what it
	// held is its deficit, and the free permits go to the nodes with one,
	// one first to each that held nothing, then in rank order up to each
	// deficit; of each of Upstreams' permits likewise
	// (ClusterView.OnUpstreams). So the nodes' shares add up to the
	// permits and their fallback queues together run no upstream above
	// its permits, counting the requests the store granted that run on
	// any node, as far as their last views agree, but for the floor: a
	// node dealt nothing (it held nothing and fewer permits were free
	// than nodes that held nothing: the queue saturated at the outage, or
	// nearly; or fewer permits than live nodes) still gets one, at most
	// one request over the permits per such node, so that its clients
	// are served one at a time rather than all time out. Where the view
	// counted more held than the permits (a permit counted that ran
	// nowhere, or a lowered capacity), the excess comes off what each
	// node held. With KVTokens,
	// the tokens its holders weighed (ClusterView.TokensBy) plus the free
	// tokens dealt the same way, at least 1; a LocalPermits set: its
	// share of the tokens as of its permits, but where tokens alone bound
	// the queue (Permits 0): the same held and free tokens' share,
	// whatever LocalPermits says. A LocalPermits set scales each
	// upstream's permits as Permits' (at least 1 each); a pool upstream's
	// tokens follow its permits' share. The node's requests the store
	// granted that still run when the fallback queue opens count in it,
	// on their upstreams and with their tokens, until they end.
	LocalPermits int
	// StoreTimeout bounds store calls made outside a request. Default 1s.
	StoreTimeout time.Duration
	// DownAfter is how many consecutive failed store calls mark the store
	// down (Acquire then answers at once without calling it). Default 2.
	DownAfter int
	// Logger receives lifecycle and error logs. Default: no logs.
	Logger *zap.Logger
	// Observer receives the queue's events, for metrics. Optional.
	Observer Observer
	// Reserved, when set, returns how many permits are held outside the
	// queue's store that still count against Permits: the requests of
	// another queue of the same name still running after a reload moved
	// the queue to another store. Store calls carry Permits, and each
	// upstream's permits (the requests may run on any), less this (at
	// least 0). It must be cheap and must not call into the Queue.
	Reserved func() int
	// ReservedTokens, when set, returns the KV-cache tokens (Request.Tokens)
	// of those same requests: store calls carry KVTokens, and each
	// upstream's, less this. Same rules as Reserved.
	ReservedTokens func() int

	// running, in a fallback queue's config, is the node's requests the
	// store granted that still run (storeRunning).
	running *storeRunning
	// poolPermits and poolTokens are the Permits and KVTokens that
	// withDefaults took from the pool (their sums, none set); 0: set by
	// the caller. A cap taken from the pool caps nothing its upstreams'
	// own do not (see limits).
	poolPermits, poolTokens int
}

// Observer receives a Queue's events. Methods are called on the request
// path: they must be fast and must not block.
type Observer interface {
	// Granted: a permit was granted after wait; queued reports whether
	// the ticket waited in the queue (false: the fast path).
	Granted(wait time.Duration, queued bool)
	// Rejected: a ticket ended without a permit (not a client leaving).
	Rejected(reason Reason, wait time.Duration)
	// Handoff: a permit released (anywhere) reached a waiter of this
	// node after d, by the store's clock at the release and this node's
	// clock at the wake-up.
	Handoff(d time.Duration)
	// StoreError: a store call failed.
	StoreError(err error)
}

func (c Config) withDefaults() Config {
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.PollInterval <= 0 {
		// A short max wait needs no longer interval than itself.
		c.PollInterval = min(DefaultPollInterval, c.MaxWait)
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.PriorityFactor == 0 {
		c.PriorityFactor = DefaultPriorityFactor
	}
	if c.DownAfter <= 0 {
		c.DownAfter = 2
	}
	if c.Permits == 0 && len(c.Upstreams) > 0 {
		c.Permits = poolPermits(c.Upstreams)
		c.poolPermits = c.Permits
	}
	if c.KVTokens == 0 && len(c.Upstreams) > 0 {
		c.KVTokens = poolTokens(c.Upstreams)
		c.poolTokens = c.KVTokens
	}
	if c.Permits == 0 && c.KVTokens > 0 {
		c.Permits = MaxPermits // tokens alone bound the queue
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// Validate reports the first invalid field of c (after defaults). It is
// the one home of these rules: the Caddy handler validates its options
// through it, and its Caddyfile parser too, to name the line.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := validUpstreams(c.Upstreams); err != nil {
		return err
	}
	if err := validPoolTokens(c.KVTokens, c.Upstreams); err != nil {
		return err
	}
	switch {
	case c.Permits <= 0:
		return fmt.Errorf("permits must be at least 1, got %d", c.Permits)
	case c.MaxWait < MinPollInterval:
		return fmt.Errorf("max_wait must be at least %s (the smallest poll_interval), got %s", MinPollInterval, c.MaxWait)
	case c.PollInterval < MinPollInterval:
		return fmt.Errorf("poll_interval must be at least %s, got %s", MinPollInterval, c.PollInterval)
	case c.PollInterval > c.MaxWait:
		return fmt.Errorf("poll_interval (%s) must not exceed max_wait (%s)", c.PollInterval, c.MaxWait)
	case c.Lease < MinLease:
		return fmt.Errorf("lease must be at least %s, got %s", MinLease, c.Lease)
	case !(c.PriorityFactor >= 2):
		return fmt.Errorf("priority_factor must be at least 2, got %v", c.PriorityFactor)
	case c.Adaptive != nil && c.Adaptive.validate() != nil:
		return c.Adaptive.validate()
	case c.Adaptive != nil && strings.HasPrefix(c.Adaptive.BackendMetrics, "/") && len(c.Upstreams) == 0:
		return fmt.Errorf("adaptive: backend_metrics %q is a path, read on each pool upstream: without upstream lines, give the backend's URL", c.Adaptive.BackendMetrics)
	case c.Adaptive != nil && c.Adaptive.BackendMetrics != "" && !strings.HasPrefix(c.Adaptive.BackendMetrics, "/") && len(c.Upstreams) > 0:
		return fmt.Errorf("adaptive: backend_metrics %q: with upstream lines, give a path read on each (e.g. /metrics)", c.Adaptive.BackendMetrics)
	case c.Adaptive != nil && c.Adaptive.BackendMetrics != "" && !strings.HasPrefix(c.Adaptive.BackendMetrics, "/") && !isHTTPURL(c.Adaptive.BackendMetrics):
		// Read at every interval, a URL that cannot be would fail each
		// time, seen only in debug logs.
		return fmt.Errorf("adaptive: backend_metrics %q: want a path on each pool upstream (/metrics) or the backend's http:// or https:// URL", c.Adaptive.BackendMetrics)
	case c.KVTokens < 0:
		return fmt.Errorf("kv_tokens must be >= 0, got %d", c.KVTokens)
	case c.Permits > MaxPermits:
		return fmt.Errorf("permits must be at most %d, got %d", MaxPermits, c.Permits)
	case c.MaxQueue < 0:
		return fmt.Errorf("max_queue must be >= 0, got %d", c.MaxQueue)
	case c.MaxQueuePerTenant < 0:
		return fmt.Errorf("max_queue_per_tenant must be >= 0, got %d", c.MaxQueuePerTenant)
	case c.MaxInFlightPerTenant < 0:
		return fmt.Errorf("max_in_flight_per_tenant must be >= 0, got %d", c.MaxInFlightPerTenant)
	}
	return nil
}

func (c Config) limits() Limits {
	permits, ups := c.Permits, c.Upstreams
	kvTokens := c.KVTokens
	// A cap the pool's sum gave (none set) leaves the upstreams' own to
	// bound it: counted as a cap, the requests still running on an
	// upstream a reload took out of the pool would keep the upstreams
	// left idle, their caches and permits free, until they end.
	if len(ups) > 0 && c.poolPermits > 0 && permits == c.poolPermits {
		permits = MaxPermits
	}
	if len(ups) > 0 && c.poolTokens > 0 && kvTokens == c.poolTokens {
		kvTokens = poolUncapped
	}
	if n := c.reserved(); n > 0 {
		// The permits held elsewhere may run on any upstream: each
		// counts them.
		permits = max(permits-n, 0)
		ups = make([]Upstream, len(c.Upstreams))
		for i, u := range c.Upstreams {
			ups[i] = Upstream{Dial: u.Dial, Permits: max(u.Permits-n, 0), KVTokens: u.KVTokens}
		}
	}
	if r := c.reservedTokens(); r > 0 && c.KVTokens > 0 {
		if n := c.reserved(); n <= 0 {
			ups = slices.Clone(c.Upstreams)
		}
		for i := range ups {
			ups[i].KVTokens = lessTokens(c.Upstreams[i].KVTokens, r)
		}
	}
	bound, _ := c.ClampTokens(math.MaxInt)
	l := Limits{Permits: permits, Tokens: lessTokens(kvTokens, c.reservedTokens()), TokenBound: bound, Learned: c.Adaptive != nil, Lease: c.Lease, MaxQueue: c.MaxQueue,
		MaxQueuePerTenant: c.MaxQueuePerTenant, MaxInFlightPerTenant: c.MaxInFlightPerTenant, Upstreams: ups}
	if c.running != nil { // a fallback queue's
		l = c.running.less(l)
	}
	return l
}

// poolUncapped is the token capacity store calls carry for a queue whose
// KVTokens is its pool's sum: more than its upstreams' together, so that
// theirs alone bound it.
const poolUncapped = math.MaxInt32

// lessTokens is a token capacity less r reserved: 0 (not counted) stays
// 0, and a capacity used up entirely is -1 (counted, no room), never 0.
func lessTokens(capacity, r int) int {
	if capacity <= 0 || r <= 0 {
		return capacity
	}
	if capacity <= r {
		return -1
	}
	return capacity - r
}

// reservedTokens is ReservedTokens(), 0 without it.
func (c Config) reservedTokens() int {
	if c.ReservedTokens == nil {
		return 0
	}
	return c.ReservedTokens()
}

// reserved is Reserved(), 0 without it.
func (c Config) reserved() int {
	if c.Reserved == nil {
		return 0
	}
	return c.Reserved()
}

// ClampTokens is the weight a request of n tokens is counted with: n
// bounded by the queue's KVTokens and, with a pool whose upstreams set
// KVTokens, by the largest of those (so it fits somewhere, and runs
// alone there). clamped reports that n was above that bound. Without
// KVTokens it is 0 (tokens are not counted).
func (c Config) ClampTokens(n int) (w int, clamped bool) {
	c = c.withDefaults()
	if c.KVTokens <= 0 {
		return 0, false
	}
	bound := c.KVTokens
	if m := maxUpstreamTokens(c.Upstreams); m > 0 {
		bound = min(bound, m)
	}
	n = max(n, 0)
	return min(n, bound), n > bound
}

// maxUpstreamTokens is the largest Upstream.KVTokens of us, 0 when none
// sets it; an upstream without it is bounded by the queue's alone.
func maxUpstreamTokens(us []Upstream) int {
	m := 0
	for _, u := range us {
		if u.KVTokens <= 0 {
			return 0
		}
		m = max(m, u.KVTokens)
	}
	return m
}
