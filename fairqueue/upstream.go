package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Upstream is one backend of a queue's pool (Config.Upstreams): a grant
// names the upstream its request is sent to, and the store never lets
// one run more than its own Permits across every node.
type Upstream struct {
	// Dial is the upstream's address as reverse_proxy dials it
	// ("10.0.0.5:8000"); it names the upstream in the store, so every
	// node must spell it the same way.
	Dial string `json:"dial"`
	// Permits is the number of requests the upstream may run at once,
	// across the cluster. At least 1.
	Permits int `json:"permits"`
}

// DefaultCooldown is how long an upstream is left out of dispatch after
// it failed a request (Permit.Cool with 0) and no Retry-After said
// otherwise.
const DefaultCooldown = time.Second

// MaxCooldown bounds a cooldown, whatever an upstream's Retry-After asks.
const MaxCooldown = 5 * time.Minute

// validUpstreams reports the first invalid entry of us.
func validUpstreams(us []Upstream) error {
	seen := make(map[string]bool, len(us))
	for i, u := range us {
		switch {
		case u.Dial == "":
			return fmt.Errorf("upstreams[%d]: dial address is empty", i)
		case strings.ContainsAny(u.Dial, " \t\r\n|"):
			return fmt.Errorf("upstreams[%d]: dial address %q must not contain spaces or '|'", i, u.Dial)
		case u.Permits < 1:
			return fmt.Errorf("upstreams[%d] (%s): permits must be at least 1, got %d", i, u.Dial, u.Permits)
		case seen[u.Dial]:
			return fmt.Errorf("upstreams[%d]: %s is listed twice", i, u.Dial)
		}
		seen[u.Dial] = true
	}
	return nil
}

// poolPermits is the sum of the upstreams' permits.
func poolPermits(us []Upstream) int {
	n := 0
	for _, u := range us {
		n += u.Permits
	}
	return n
}

// UpstreamInfo is one upstream's state in the store (Snapshot.Upstreams).
type UpstreamInfo struct {
	Dial string `json:"dial"`
	// InFlight is the number of permits held on it, across the cluster.
	InFlight int `json:"in_flight"`
	// CoolLeft is the time until it is dispatched to again after a
	// failure (0: it is in dispatch).
	CoolLeft time.Duration `json:"cool_left"`
}

// RequeueArgs is one Store.Requeue call: the held ticket Old gives its
// permit back, and the new ticket (TicketArgs.ID, same node and flow)
// takes Old's place in the queue.
type RequeueArgs struct {
	// TicketArgs is the new ticket. Its Correction applies to Old's
	// release (usually minus Old's cost: the grant is undone), and its
	// Cool and CoolFor to the upstream Old held.
	TicketArgs
	// Old is the ticket that holds the permit given back.
	Old string
	// Seq is Old's arrival order: the new ticket is served before every
	// ticket that arrived after it.
	Seq int64
}

// Upstream returns the upstream the permit was granted on (Config.Upstreams),
// or "" when the queue has no pool.
func (p *Permit) Upstream() string {
	if p.local != nil {
		return p.local.Upstream()
	}
	if u := p.t.upstream.Load(); u != nil {
		return *u
	}
	return ""
}

// Cool asks that the permit's upstream be left out of dispatch for d
// (across the cluster) from its Release: it failed the request (refused
// the connection, timed out, answered 503). d <= 0 is DefaultCooldown;
// it is bounded by MaxCooldown. A permit without an upstream ignores it.
func (p *Permit) Cool(d time.Duration) {
	d = coolFor(d)
	p.cool.Store(&d)
}

func coolFor(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultCooldown
	}
	return min(d, MaxCooldown)
}

// errReleased is returned by Requeue on a permit already released.
var errReleased = errors.New("fair queue: requeue of a released permit")

// Requeue gives the permit back and waits again at the request's place
// in the queue (before every request that arrived after it), as one
// store step: an upstream refused the request before anything was sent
// to the client. The upstream cools for cool (see Cool; cool < 0: it
// does not cool). The wait ends as Acquire's does, at the first
// Acquire's max wait; the request's flow is not charged for the grant
// given back. The Permit must not be used afterwards; Release the
// returned one.
func (p *Permit) Requeue(ctx context.Context, cool time.Duration) (*Permit, error) {
	claimed := false
	p.once.Do(func() { claimed = true })
	if !claimed {
		return nil, errReleased
	}
	q := p.q
	if p.local != nil || p.t.failOpen {
		// Admitted without the store: no place to keep; ask again. The
		// local queue cools the upstream as the store would.
		if cool >= 0 {
			p.Cool(cool)
		}
		p.releaseNow()
		req := p.req
		req.MaxWait = time.Until(p.deadline)
		if req.MaxWait <= 0 {
			return nil, q.reject(ReasonTimeout, p.start, 0, nil)
		}
		return q.Acquire(ctx, req)
	}
	q.forget(p.t)
	cfg := q.cfg.Load()
	t := q.newTicket(false, TicketFlow(p.t.id))
	if t == nil {
		q.releaseID(p.t.id, -p.t.cost)
		return nil, q.reject(ReasonShuttingDown, p.start, 0, nil)
	}
	t.seq, t.cost, t.scale = p.t.seq, p.t.cost, p.t.scale
	args := RequeueArgs{Old: p.t.id, Seq: p.t.seq, TicketArgs: TicketArgs{ID: t.id, Node: q.node,
		Limits: cfg.limits(), Cost: t.cost, Correction: -p.t.cost}}
	if up := p.Upstream(); up != "" && cool >= 0 {
		args.Cool, args.CoolFor = up, coolFor(cool)
	}
	actx, cancel := context.WithDeadline(ctx, p.deadline)
	res, err := q.store.Requeue(actx, args)
	cancel()
	q.health.record(q.log, err)
	if err != nil {
		// It may have run: take the new ticket out, give the old permit
		// back (both idempotent).
		t.state.CompareAndSwap(statePending, stateCancelled)
		q.forget(t)
		old := p.t.id
		q.background(func() {
			q.cancelInStore(t, true)
			q.releaseID(old, 0)
		})
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !time.Now().Before(p.deadline) {
			return nil, q.reject(ReasonTimeout, p.start, 0, err)
		}
		return nil, q.reject(ReasonStoreUnavailable, p.start, 0, err)
	}
	q.observe(res.Grants, res.Epoch)
	if res.Gone {
		t.state.CompareAndSwap(statePending, stateCancelled)
		q.cleanup(t, false)
		return nil, errors.New("fair queue: ticket cancelled before it was queued")
	}
	t.position, t.grants0 = res.Position, res.Grants
	if res.Granted {
		q.grant(t, res.GrantNo, res.Upstream)
	} else {
		t.queued.Store(true)
		if p.req.OnQueued != nil {
			p.req.OnQueued(Waiting{q: q, t: t})
		}
	}
	np, err := q.wait(ctx, t, p.start, p.deadline)
	if np != nil {
		np.req, np.deadline = p.req, p.deadline
	}
	return np, err
}

// localUpstream names an upstream for a permit admitted without the
// store (fail open), round robin: no cluster-wide count applies to it.
func (q *Queue) localUpstream(cfg *Config) string {
	if len(cfg.Upstreams) == 0 {
		return ""
	}
	n := q.rr.Add(1)
	return cfg.Upstreams[int(n%uint64(len(cfg.Upstreams)))].Dial
}

// upstreamOf is t's granted upstream, or "".
func upstreamOf(t *ticket) string {
	if u := t.upstream.Load(); u != nil {
		return *u
	}
	return ""
}

// upstreamsOf maps the tickets of ts that hold an upstream to it (nil
// when none does).
func upstreamsOf(ts ...[]*ticket) map[string]string {
	var m map[string]string
	for _, l := range ts {
		for _, t := range l {
			if u := upstreamOf(t); u != "" {
				if m == nil {
					m = make(map[string]string)
				}
				m[t.id] = u
			}
		}
	}
	return m
}
