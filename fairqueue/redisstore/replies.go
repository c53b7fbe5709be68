package redisstore

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The scripts' replies, one decoder per script, each beside the shape it
// reads: a new field is one edit here and one in the script's reply.

// decodeGrants reads the grants a script's dispatch made to the calling
// node's own waiters: {ticket, grant no, upstream, Redis ms, ...}
// (dispatch in lua/dispatch.lua). cancel.lua's whole reply is this list.
func decodeGrants(v any) []fairqueue.Grant {
	var gs []fairqueue.Grant
	l := asList(v)
	for i := 0; i+3 < len(l); i += 4 {
		id, _ := l[i].(string)
		up, _ := l[i+2].(string)
		gs = append(gs, fairqueue.Grant{Ticket: id, No: toInt(l[i+1]), Upstream: up, At: time.UnixMilli(toInt(l[i+3]))})
	}
	return gs
}

// decodeAcquire reads acquire.lua's (and requeue.lua's) answer: {status,
// seq, grant no, position, grants, epoch, own grants, upstream}.
func decodeAcquire(v []any) (fairqueue.AcquireResult, []fairqueue.Grant, error) {
	if len(v) != 8 {
		return fairqueue.AcquireResult{}, nil, fmt.Errorf("unexpected reply %v", v)
	}
	status, _ := v[0].(string)
	epoch, _ := v[5].(string)
	up, _ := v[7].(string)
	return fairqueue.AcquireResult{
		Upstream: up,
		Granted:  status == "granted",
		Gone:     status == "gone",
		Full:     status == "full",
		Seq:      toInt(v[1]),
		GrantNo:  toInt(v[2]),
		Position: int(toInt(v[3])),
		Grants:   toInt(v[4]),
		Epoch:    epoch,
	}, decodeGrants(v[6]), nil
}

// handOnReply is what release.lua and transfer.lua answer: the grants
// their dispatch made to the caller's own waiters, and the caller's
// tickets now heading the queue, in order (none if another node's
// heads it; see fairqueue.HeadListener).
type handOnReply struct {
	own   []fairqueue.Grant
	heads []string
}

// decodeRelease reads release.lua's answer: {own grants, heads}.
func decodeRelease(v any) (handOnReply, error) {
	l := asList(v)
	if len(l) != 2 {
		return handOnReply{}, fmt.Errorf("unexpected reply %v", v)
	}
	return handOnReply{own: decodeGrants(l[0]), heads: stringList(l[1])}, nil
}

// decodeTransfer reads transfer.lua's answer: {own grants, heads, added,
// grant no}. When the script added waiter to's holder entry (added 1),
// that grant, with its number, counts among the own grants: a node whose
// request on it ended meanwhile releases it again. It has no time: the
// node observed its handoff as it started the waiter.
func decodeTransfer(v any, to string) (handOnReply, error) {
	l := asList(v)
	if len(l) != 4 {
		return handOnReply{}, fmt.Errorf("unexpected reply %v", v)
	}
	r := handOnReply{own: decodeGrants(l[0]), heads: stringList(l[1])}
	if toInt(l[2]) == 1 {
		r.own = append(r.own, fairqueue.Grant{Ticket: to, No: toInt(l[3])})
	}
	return r, nil
}

// decodeHeartbeat reads heartbeat.lua's answer: {epoch, rejoined,
// waiting, holders, nodes, expired, re-added, missing, tokens held, time,
// rank, {rank, permits, tokens, ...} of the live nodes that hold any,
// {{dial, held, rank, held by it, ...}, ...} of the pool}.
func decodeHeartbeat(v []any) (fairqueue.HeartbeatResult, error) {
	if len(v) != 13 {
		return fairqueue.HeartbeatResult{}, fmt.Errorf("unexpected reply %v", v)
	}
	epoch, _ := v[0].(string)
	nodes := int(toInt(v[4]))
	c := fairqueue.ClusterView{Waiting: int(toInt(v[2])), Holders: int(toInt(v[3])), Nodes: nodes,
		Rank: int(toInt(v[10])), LeaseExpirations: toInt(v[5]), TokensHeld: int(toInt(v[8]))}
	if by := asList(v[11]); len(by) >= 3 {
		c.HeldBy, c.TokensBy = make([]int, nodes), make([]int, nodes)
		for i := 0; i+2 < len(by); i += 3 {
			if r := int(toInt(by[i])); r >= 0 && r < nodes {
				c.HeldBy[r], c.TokensBy[r] = int(toInt(by[i+1])), int(toInt(by[i+2]))
			}
		}
	}
	if ups := asList(v[12]); len(ups) > 0 {
		c.OnUpstreams = make(map[string]fairqueue.HeldOn, len(ups))
		for _, e := range ups {
			l := asList(e)
			if len(l) < 2 {
				continue
			}
			dial, _ := l[0].(string)
			h := fairqueue.HeldOn{All: int(toInt(l[1]))}
			if len(l) >= 4 {
				h.By = make([]int, nodes)
				for i := 2; i+1 < len(l); i += 2 {
					if r := int(toInt(l[i])); r >= 0 && r < nodes {
						h.By[r] = int(toInt(l[i+1]))
					}
				}
			}
			c.OnUpstreams[dial] = h
		}
	}
	return fairqueue.HeartbeatResult{Epoch: epoch, Rejoined: toInt(v[1]) == 1, Cluster: c,
		Readded: stringList(v[6]), Missing: stringList(v[7]), At: time.UnixMilli(toInt(v[9]))}, nil
}

// decodeReconcile reads reconcile.lua's answer: {epoch, grants, waiting,
// holder tickets of the node, own grants, the holders' upstreams}.
func decodeReconcile(v []any) (fairqueue.ReconcileResult, []fairqueue.Grant, error) {
	if len(v) != 6 {
		return fairqueue.ReconcileResult{}, nil, fmt.Errorf("unexpected reply %v", v)
	}
	epoch, _ := v[0].(string)
	res := fairqueue.ReconcileResult{Epoch: epoch, Grants: toInt(v[1]), Waiting: int(toInt(v[2])), Holders: stringList(v[3])}
	for i, u := range asList(v[5]) {
		if up, _ := u.(string); up != "" && i < len(res.Holders) {
			if res.Upstreams == nil {
				res.Upstreams = make(map[string]string)
			}
			res.Upstreams[res.Holders[i]] = up
		}
	}
	return res, decodeGrants(v[4]), nil
}

// decodeInspect reads inspect.lua's answer: {waiting, head tickets,
// {holder, ms left, ...}, {node, ms left, ...}, {flow, waiting, ...},
// grants, {holder, upstream, ...}, {upstream, ms cooling left, ...},
// tokens held, {holder, tokens, ...}, {upstream, tokens held, ...},
// {share key, learned share, ...}}.
func decodeInspect(v []any) (fairqueue.Snapshot, error) {
	if len(v) != 12 {
		return fairqueue.Snapshot{}, fmt.Errorf("unexpected reply %v", v)
	}
	snap := fairqueue.Snapshot{Waiting: int(toInt(v[0])), Head: stringList(v[1]), Grants: toInt(v[5])}
	pairs(v[2], func(id string, ms int64) {
		snap.Holders = append(snap.Holders, fairqueue.Holder{Ticket: id, Node: fairqueue.TicketNode(id), LeaseLeft: time.Duration(ms) * time.Millisecond})
	})
	pairs(v[3], func(id string, ms int64) {
		snap.Nodes = append(snap.Nodes, fairqueue.NodeInfo{ID: id, Alive: ms >= 0, ExpiresIn: time.Duration(ms) * time.Millisecond})
	})
	for _, f := range asList(v[4]) {
		if f := asList(f); len(f) == 4 {
			name, _ := f[0].(string)
			usage, _ := f[3].(string)
			u, _ := strconv.ParseFloat(usage, 64)
			snap.Flows = append(snap.Flows, fairqueue.FlowInfo{Flow: name, Waiting: int(toInt(f[1])), Held: int(toInt(f[2])), Usage: u})
		}
	}
	decodePool(&snap, asList(v[6]), asList(v[7]))
	decodeTokens(&snap, v[8], asList(v[9]), asList(v[10]))
	shares := map[string]float64{}
	for l, i := asList(v[11]), 0; i+1 < len(l); i += 2 {
		k, _ := l[i].(string)
		str, _ := l[i+1].(string)
		if f, err := strconv.ParseFloat(str, 64); err == nil {
			shares[k] = f
		}
	}
	snap.LearnedShare = shares[""]
	snap.Upstreams = fairqueue.WithShares(snap.Upstreams, shares)
	return snap, nil
}

// decodePool fills snap's upstreams from inspect.lua's {holder, upstream,
// ...} and {upstream, ms cooling left, ...}.
func decodePool(snap *fairqueue.Snapshot, held, cooling []any) {
	byID := map[string]string{}
	ups := map[string]*fairqueue.UpstreamInfo{}
	get := func(dial string) *fairqueue.UpstreamInfo {
		if ups[dial] == nil {
			ups[dial] = &fairqueue.UpstreamInfo{Dial: dial}
		}
		return ups[dial]
	}
	for i := 0; i+1 < len(held); i += 2 {
		id, _ := held[i].(string)
		dial, _ := held[i+1].(string)
		byID[id] = dial
	}
	for i := range snap.Holders {
		if dial := byID[snap.Holders[i].Ticket]; dial != "" {
			snap.Holders[i].Upstream = dial
			get(dial).InFlight++
		}
	}
	pairs(cooling, func(dial string, ms int64) { get(dial).CoolLeft = time.Duration(ms) * time.Millisecond })
	for _, u := range ups {
		snap.Upstreams = append(snap.Upstreams, *u)
	}
	slices.SortFunc(snap.Upstreams, func(a, b fairqueue.UpstreamInfo) int { return strings.Compare(a.Dial, b.Dial) })
}

// parseGrant reads a grant message: "<ticket> <grant no> <Redis
// ms>[/<permits>] [<upstream>]" (the permits of the call that made it;
// absent from a node of an earlier version).
func parseGrant(payload string) (fairqueue.Grant, bool) {
	f := strings.Fields(payload)
	if len(f) == 0 {
		return fairqueue.Grant{}, false
	}
	g := fairqueue.Grant{Ticket: f[0]}
	if len(f) > 1 {
		g.No, _ = strconv.ParseInt(f[1], 10, 64)
	}
	if len(f) > 2 {
		at, permits, _ := strings.Cut(f[2], "/")
		if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
			g.At = time.UnixMilli(ms)
		}
		if n, err := strconv.Atoi(permits); err == nil && n > 0 {
			g.Permits = n
		}
	}
	if len(f) > 3 {
		g.Upstream = f[3]
	}
	return g, true
}

// stringList reads a script's list of strings.
func stringList(v any) []string {
	var out []string
	for _, x := range asList(v) {
		if id, ok := x.(string); ok {
			out = append(out, id)
		}
	}
	return out
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return 0
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func pairs(v any, f func(string, int64)) {
	l := asList(v)
	for i := 0; i+1 < len(l); i += 2 {
		k, _ := l[i].(string)
		f(k, toInt(l[i+1]))
	}
}

// decodeTokens fills snap's tokens from inspect.lua's tokens held,
// {holder, tokens, ...} and {upstream, tokens held, ...}.
func decodeTokens(snap *fairqueue.Snapshot, sum any, held, ups []any) {
	snap.TokensHeld = int(toInt(sum))
	w := map[string]int64{}
	pairs(held, func(id string, n int64) { w[id] = n })
	for i := range snap.Holders {
		snap.Holders[i].Tokens = int(w[snap.Holders[i].Ticket])
	}
	pairs(ups, func(dial string, n int64) {
		i := slices.IndexFunc(snap.Upstreams, func(u fairqueue.UpstreamInfo) bool { return u.Dial == dial })
		if i < 0 {
			snap.Upstreams = append(snap.Upstreams, fairqueue.UpstreamInfo{Dial: dial})
			i = len(snap.Upstreams) - 1
		}
		snap.Upstreams[i].TokensHeld = int(n)
	})
	slices.SortFunc(snap.Upstreams, func(a, b fairqueue.UpstreamInfo) int { return strings.Compare(a.Dial, b.Dial) })
}
