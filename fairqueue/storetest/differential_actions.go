package storetest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The calls rapid draws in the differential test (differential.go).

var diffTenants = []string{"a", "b", "c"}

func (d *diff) acquire(rt *rapid.T) {
	d.acquireAs(rt, "n1", d.ticketLimits)
}

// acquireAs acquires a new ticket of node under the settings lim gives.
func (d *diff) acquireAs(rt *rapid.T, node string, lim func(*dTicket) fairqueue.Limits) {
	d.counter++
	id := fairqueue.TicketID{Node: node, Counter: d.counter}
	cost, scale := 1.0, 1.0
	if d.fair {
		tenant := rapid.SampledFrom(diffTenants).Draw(rt, "tenant")
		band := rapid.SampledFrom([]int{0, 0, 0, 1, 3}).Draw(rt, "band")
		weight := rapid.SampledFrom([]float64{1, 1, 2, 4, 1.0 / 1024}).Draw(rt, "weight")
		id.Flow = fmt.Sprintf("%s.%d", fairqueue.TenantKey(tenant), band)
		req := rapid.SampledFrom([]float64{1, 1, 2, 3, 5, fairqueue.MaxCost}).Draw(rt, "cost")
		scale = 1 / (weight * float64(int(1)<<(3*band))) // factor 8
		cost = req * scale
		d.logf("# ticket %s: tenant %s band %d weight %v cost %v", id, tenant, band, weight, req)
	}
	tk := &dTicket{id: id.String(), node: node, cost: cost, scale: scale}
	tk.old = d.roll != nil && rapid.Bool().Draw(rt, "oldSettings")
	l := lim(tk)
	if l.TokenBound > 0 {
		// Clamped as a Queue clamps it; what it asks goes with it (a
		// reload that raises the bound weighs that at the grant).
		n := rapid.IntRange(0, l.TokenBound+4).Draw(rt, "ticketTokens")
		tk.tokens = min(n, l.TokenBound)
		if tk.tokens > 0 && n > tk.tokens {
			tk.asks = n
		}
	}
	d.tickets = append(d.tickets, tk)
	args := fairqueue.TicketArgs{ID: tk.id, Node: node, Limits: l, Cost: tk.cost, Tokens: tk.tokens, Asks: tk.asks}
	var res fairqueue.AcquireResult
	d.noteJoin(node)
	d.eachAs(node, fmt.Sprintf("acquire %s (tokens %d, asks %d)", tk.id, tk.tokens, tk.asks), func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		var err error
		res, err = s.Acquire(context.Background(), args)
		var own []fairqueue.Grant
		if res.Granted {
			own = []fairqueue.Grant{{Ticket: tk.id, No: res.GrantNo, Upstream: res.Upstream}}
		}
		return fmtResult(res), own, err
	})
	tk.seq = res.Seq // the same on both
	if !res.Granted && !res.Full && !res.Gone {
		tk.waiting = true
	}
}

func fmtResult(res fairqueue.AcquireResult) string {
	switch {
	case res.Full:
		return "full"
	case res.Gone:
		return "gone"
	case res.Granted:
		return fmt.Sprintf("granted seq %d on %q", res.Seq, res.Upstream)
	}
	return fmt.Sprintf("queued seq %d", res.Seq) // its position is an estimate: the stores may differ
}

func (d *diff) pick(rt *rapid.T, label string, match func(*dTicket) bool) *dTicket {
	var ts []*dTicket
	for _, t := range d.tickets {
		if match(t) {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		rt.Skip("no " + label)
	}
	return rapid.SampledFrom(ts).Draw(rt, label)
}

func (d *diff) release(rt *rapid.T) {
	tk := d.pick(rt, "holder", func(t *dTicket) bool { return t.held })
	args := fairqueue.TicketArgs{ID: tk.id, Node: tk.node, Limits: d.ticketLimits(tk)}
	if d.fair && rapid.Bool().Draw(rt, "charge") {
		used := rapid.SampledFrom([]float64{0, 1, 2, 8, fairqueue.MaxCost}).Draw(rt, "used")
		args.Correction = used*tk.scale - tk.cost
	}
	if tk.up != "" && rapid.IntRange(0, 3).Draw(rt, "cool") == 0 {
		args.Cool, args.CoolFor = tk.up, time.Minute
	}
	tk.held = false
	d.gone = append(d.gone, tk)
	d.noteRelease()
	d.eachAs(tk.node, fmt.Sprintf("release %s (correction %v, cool %q)", tk.id, args.Correction, args.Cool), func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		return "", nil, s.Release(context.Background(), args)
	})
}

func (d *diff) cancel(rt *rapid.T) {
	tk := d.pick(rt, "waiter", func(t *dTicket) bool { return t.waiting })
	tk.waiting = false
	d.gone = append(d.gone, tk)
	d.eachAs(tk.node, "cancel "+tk.id, func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		return "", nil, s.Cancel(context.Background(), fairqueue.TicketArgs{ID: tk.id, Node: tk.node, Limits: d.ticketLimits(tk)})
	})
}

// heartbeat renews the node's permits, perhaps naming one it released
// without a mark (the store counts it again: the node releases it
// again), adopting a permit it admitted while the store was unreachable
// (fail open), and naming its waiters (and one that is gone) pending.
func (d *diff) heartbeat(rt *rapid.T) {
	d.beat++
	hb := fairqueue.HeartbeatArgs{Node: "n1", Limits: d.limits(rt), Beat: d.beat, Upstreams: map[string]string{}, Tokens: map[string]int{}}
	d.heartbeatAs(rt, hb)
}

// heartbeatAs sends hb, naming the tickets of hb.Node (and a ghost, and
// an adopted one, where rapid draws them).
func (d *diff) heartbeatAs(rt *rapid.T, hb fairqueue.HeartbeatArgs) {
	name := func(t *dTicket) {
		if t.up != "" {
			hb.Upstreams[t.id] = t.up
		}
		if t.tokens > 0 {
			hb.Tokens[t.id] = t.tokens
		}
	}
	for _, t := range d.tickets {
		if t.node != hb.Node {
			continue
		}
		if t.held {
			hb.Held = append(hb.Held, t.id)
			name(t)
		}
		if t.waiting {
			hb.Pending = append(hb.Pending, t.id)
		}
	}
	var gone []*dTicket
	for _, t := range d.gone {
		if t.node == hb.Node {
			gone = append(gone, t)
		}
	}
	if len(gone) > 0 && rapid.Bool().Draw(rt, "ghost") {
		t := rapid.SampledFrom(gone).Draw(rt, "released")
		hb.Held = append(hb.Held, t.id)
		hb.Pending = append(hb.Pending, t.id)
		name(t)
	}
	var adopted *dTicket
	if rapid.Bool().Draw(rt, "adopt") {
		d.counter++
		id := fairqueue.TicketID{Node: hb.Node, Counter: d.counter}
		if d.fair {
			id.Flow = fmt.Sprintf("%s.%d", fairqueue.TenantKey(rapid.SampledFrom(diffTenants).Draw(rt, "tenant")), 0)
		}
		adopted = &dTicket{id: id.String(), node: hb.Node, cost: 1, scale: 1, adopted: true}
		if d.lim.TokenBound > 0 {
			adopted.tokens = rapid.IntRange(0, d.lim.TokenBound).Draw(rt, "ticketTokens")
		}
		if len(hb.Limits.Upstreams) > 0 {
			adopted.up = rapid.SampledFrom(hb.Limits.Upstreams).Draw(rt, "upstream").Dial
		}
		hb.Adopt = append(hb.Adopt, adopted.id)
		name(adopted)
		d.tickets = append(d.tickets, adopted)
	}
	var res fairqueue.HeartbeatResult
	d.noteJoin(hb.Node)
	d.eachAs(hb.Node, fmt.Sprintf("%s heartbeat %d: held %v, adopt %v, pending %v", hb.Node, hb.Beat, hb.Held, hb.Adopt, hb.Pending), func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		var err error
		res, err = s.Heartbeat(context.Background(), hb)
		c := res.Cluster
		return fmt.Sprintf("rejoined %v, readded %v, missing %v, waiting %d, holders %d, tokens %d, nodes %d, rank %d, held by %v (tokens %v), on upstreams %v",
			res.Rejoined, res.Readded, res.Missing, c.Waiting, c.Holders, c.TokensHeld, c.Nodes, c.Rank, c.HeldBy, c.TokensBy, c.OnUpstreams), nil, err
	})
	if adopted != nil {
		adopted.held = true
	}
	// A ticket counted again that the node no longer runs: the node
	// releases it again at once.
	for _, id := range res.Readded {
		d.noteRelease()
		d.eachAs(hb.Node, "release again "+id, func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
			return "", nil, s.Release(context.Background(), fairqueue.TicketArgs{ID: id, Node: hb.Node, Limits: hb.Limits})
		})
	}
}

// adapt reports what a node saw of a share's requests (the learned
// capacity): the share moves at once (no interval), by steps that are
// exact in binary. The node is n1, n2 or one not in the queue
// (adaptNode): the queue's share is not lowered on the last one's
// report, nor within fairqueue.HeadsTTL of a join while two nodes are in
// the queue.
func (d *diff) adapt(rt *rapid.T) {
	if !d.lim.Learned {
		rt.Skip("no learned capacity")
	}
	keys := []string{""}
	for _, u := range d.lim.Upstreams {
		keys = append(keys, u.Dial)
	}
	r := fairqueue.AdaptReport{Key: rapid.SampledFrom(keys).Draw(rt, "key"), Samples: rapid.IntRange(0, 4).Draw(rt, "samples")}
	r.Over = rapid.IntRange(0, r.Samples).Draw(rt, "over")
	r.Refused = rapid.SampledFrom([]int{0, 0, 1}).Draw(rt, "refused")
	r.Answered = rapid.SampledFrom([]int{0, 0, 3}).Draw(rt, "answered") // plain answers, untimed
	a := fairqueue.AdaptArgs{Node: d.adaptNode(rt), Reports: []fairqueue.AdaptReport{r}, Limited: rapid.Bool().Draw(rt, "limited"),
		Floor:    rapid.SampledFrom([]float64{0.125, 0.125, 0.5}).Draw(rt, "floor"), // 0.5: a reload raised it
		Decrease: 0.5, Step: 0.25, BreachShare: 0.5,
		MinSamples: rapid.SampledFrom([]int{1, 1, 8}).Draw(rt, "min samples")} // 8: a window that takes a few reports
	d.each(fmt.Sprintf("adapt %+v limited %v floor %v min samples %d", r, a.Limited, a.Floor, a.MinSamples), func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		ad, ok := s.(fairqueue.Adapter)
		if !ok {
			return "", nil, nil
		}
		shares, err := ad.Adapt(context.Background(), a)
		return fmt.Sprint(shares), nil, err
	})
	d.reconcile(rt) // a share that grew frees permits: the next call dispatches
}

// resend sends a ticket's acquire again (a client retry after a lost
// answer) of a ticket waiting or holding: it changes nothing.
func (d *diff) resend(rt *rapid.T) {
	tk := d.pick(rt, "ticket", func(t *dTicket) bool { return t.held || t.waiting })
	args := fairqueue.TicketArgs{ID: tk.id, Node: tk.node, Limits: d.ticketLimits(tk), Cost: tk.cost, Tokens: tk.tokens, Asks: tk.asks}
	d.eachAs(tk.node, "acquire again "+tk.id, func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		res, err := s.Acquire(context.Background(), args)
		return fmtResult(res), nil, err
	})
}

// cancelHeld cancels a ticket that holds a permit: its waiter gave up as
// the grant came.
func (d *diff) cancelHeld(rt *rapid.T) {
	tk := d.pick(rt, "holder", func(t *dTicket) bool { return t.held })
	tk.held = false
	d.eachAs(tk.node, "cancel (held) "+tk.id, func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		return "", nil, s.Cancel(context.Background(), fairqueue.TicketArgs{ID: tk.id, Node: tk.node, Limits: d.ticketLimits(tk)})
	})
}

// requeue puts a holder back at its place as a new ticket, as
// Permit.Requeue does after an upstream refused the request.
func (d *diff) requeue(rt *rapid.T) {
	// A permit admitted without the store (fail open, adopted) is not
	// requeued: its request asks again (Permit.Requeue).
	old := d.pick(rt, "holder", func(t *dTicket) bool { return t.held && !t.adopted })
	d.counter++
	oid, _ := fairqueue.ParseTicketID(old.id)
	nid := fairqueue.TicketID{Node: old.node, Counter: d.counter, Flow: oid.Flow}.String()
	args := fairqueue.RequeueArgs{TicketArgs: fairqueue.TicketArgs{ID: nid, Node: old.node, Limits: d.ticketLimits(old), Cost: old.cost,
		Tokens: old.tokens, Asks: old.asks, Correction: -old.cost}, Old: old.id, Seq: old.seq}
	if old.up != "" && rapid.Bool().Draw(rt, "cool") {
		args.Cool, args.CoolFor = old.up, time.Minute
	}
	old.held = false
	d.tickets = append(d.tickets, &dTicket{id: nid, node: old.node, seq: old.seq, cost: old.cost, scale: old.scale, tokens: old.tokens, asks: old.asks,
		waiting: true, old: old.old})
	d.noteJoin(old.node)
	d.requeues = append(d.requeues, dRequeue{args, old})
	d.eachAs(old.node, fmt.Sprintf("requeue %s as %s at seq %d (cool %q)", old.id, nid, old.seq, args.Cool), func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		res, err := s.Requeue(context.Background(), args)
		return fmtResult(res), nil, err
	})
}

// requeueAgain sends an earlier requeue again: go-redis's copy after a
// read timeout, which reaches the store while the new ticket waits or
// holds (it changes nothing), or late, after the new ticket ended, was
// requeued in turn or cancelled (it queues and cools nothing: the old
// ticket's tombstone). It carries the settings in force, as every call
// of the test does (a reload's are not compared before the reconcile
// that follows it: see Differential).
func (d *diff) requeueAgain(rt *rapid.T) {
	if len(d.requeues) == 0 {
		rt.Skip("no requeue")
	}
	rq := d.requeues[rapid.IntRange(0, len(d.requeues)-1).Draw(rt, "requeueSentAgain")]
	args := rq.args
	args.Limits = d.ticketLimits(rq.old)
	d.eachAs(args.Node, fmt.Sprintf("requeue %s as %s sent again (cool %q)", args.Old, args.ID, args.Cool), func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		res, err := s.Requeue(context.Background(), args)
		return fmtResult(res), nil, err
	})
}

func (d *diff) reconcile(rt *rapid.T) {
	lim := d.limits(rt)
	d.each("reconcile", func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		_, err := s.Reconcile(context.Background(), "n1", lim)
		return "", nil, err
	})
}

// reload changes the settings every later call carries, as a config
// reload does: the permits, the tenant cap, the token capacity; then the
// node reconciles.
func (d *diff) reload(rt *rapid.T) {
	l := d.lim
	l.Permits = rapid.IntRange(1, 4).Draw(rt, "permits")
	l.MaxInFlightPerTenant = rapid.SampledFrom([]int{0, 1, 2}).Draw(rt, "tenantCap")
	l.MaxQueue = rapid.SampledFrom([]int{0, 0, 4, 8}).Draw(rt, "maxQueue")
	switch rapid.IntRange(0, 5).Draw(rt, "tokenChange") {
	case 0: // kv_tokens on or off
		if l.Tokens != 0 {
			l.Tokens, l.TokenBound = 0, 0
			for i := range l.Upstreams {
				l.Upstreams[i].KVTokens = 0
			}
		} else {
			l.Tokens = rapid.IntRange(4, 12).Draw(rt, "kvTokens")
			l.TokenBound = l.Tokens
		}
	case 1: // reserved tokens (a reload that moved the queue): less room, the same bound
		if l.TokenBound > 0 {
			l.Tokens = lessTokensThan(l.TokenBound, rapid.IntRange(1, l.TokenBound).Draw(rt, "reserved"))
		}
	default:
		if l.Tokens != 0 {
			l.Tokens = rapid.IntRange(4, 12).Draw(rt, "kvTokens")
			l.TokenBound = l.Tokens
		}
	}
	if rapid.IntRange(0, 3).Draw(rt, "poolChange") == 0 {
		l.Upstreams = drawPool(rt, max(l.TokenBound, l.Tokens))
	} else {
		l.Upstreams = slices.Clone(l.Upstreams)
	}
	if rapid.IntRange(0, 3).Draw(rt, "fairChange") == 0 {
		d.fair = !d.fair
	}
	old := d.lim
	d.lim = withBound(l)
	d.logf("reload: %s, fair %v", fmtLimits(l), d.fair)
	// A node reconciles within a poll interval: only then does the Redis
	// store make ready the flows of a tenant whose cap the reload raised
	// (docs/design.md, max_in_flight_per_tenant); the in-process store
	// does at once. The test does not look in between.
	d.each("reconcile", func(s fairqueue.Store) (string, []fairqueue.Grant, error) {
		_, err := s.Reconcile(context.Background(), "n1", d.lim)
		return "", nil, err
	})
	d.rolling(rt, old)
}
