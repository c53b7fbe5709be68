package fairqueue

import (
	"fmt"
	"slices"
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
	// KVTokens is the KV-cache tokens the upstream's requests may hold
	// at once, across the cluster (see Config.KVTokens); 0: only the
	// queue's KVTokens applies to it. Set on some upstreams of a pool
	// and not others, the queue's KVTokens is required.
	KVTokens int `json:"kv_tokens,omitempty"`
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
		case u.KVTokens < 0:
			return fmt.Errorf("upstreams[%d] (%s): kv_tokens must be >= 0, got %d", i, u.Dial, u.KVTokens)
		case seen[u.Dial]:
			return fmt.Errorf("upstreams[%d]: %s is listed twice", i, u.Dial)
		}
		seen[u.Dial] = true
	}
	return nil
}

// validPoolTokens reports a pool whose upstreams set KVTokens only in
// part while the queue's kvTokens (after defaults) is 0: the queue's
// capacity defaults to the upstreams' sum only when every one sets it,
// so nothing would count the tokens of those that do.
func validPoolTokens(kvTokens int, us []Upstream) error {
	if kvTokens != 0 {
		return nil
	}
	with, without := 0, -1
	for i, u := range us {
		if u.KVTokens > 0 {
			with++
		} else if without < 0 {
			without = i
		}
	}
	if with == 0 || without < 0 {
		return nil
	}
	return fmt.Errorf("kv_tokens is set on %d of the %d upstreams, not on upstreams[%d] (%s): set it on every upstream, or kv_tokens on the queue too",
		with, len(us), without, us[without].Dial)
}

// poolPermits is the sum of the upstreams' permits.
func poolPermits(us []Upstream) int {
	n := 0
	for _, u := range us {
		n += u.Permits
	}
	return n
}

// poolTokens is the sum of the upstreams' KVTokens, or 0 when one of
// them does not set it (that one is bounded by the queue's alone).
func poolTokens(us []Upstream) int {
	n := 0
	for _, u := range us {
		if u.KVTokens <= 0 {
			return 0
		}
		n += u.KVTokens
	}
	return n
}

// UpstreamInfo is one upstream's state in the store (Snapshot.Upstreams).
type UpstreamInfo struct {
	Dial string `json:"dial"`
	// InFlight is the number of permits held on it, across the cluster.
	InFlight int `json:"in_flight"`
	// TokensHeld is the KV-cache tokens its holders hold (their
	// Request.Tokens), across the cluster.
	TokensHeld int `json:"tokens_held,omitempty"`
	// LearnedShare is its share of its configured capacity in force
	// (Config.Adaptive); 0 when nothing was learned.
	LearnedShare float64 `json:"learned_share,omitempty"`
	// CoolLeft is the time until it is dispatched to again after a
	// failure (0: it is in dispatch).
	CoolLeft time.Duration `json:"cool_left"`
}

// RequeueArgs is one Store.Requeue call: the held ticket Old gives its
// permit back, and the new ticket (TicketArgs.ID, same node and flow)
// takes Old's place in the queue.
type RequeueArgs struct {
	// TicketArgs is the new ticket. Its Correction applies to Old's
	// release (usually minus Old's cost: the grant is undone), its Cool
	// and CoolFor to the upstream Old held, and its Tombstone marks Old
	// given back (see TicketArgs.Tombstone).
	TicketArgs
	// Old is the ticket that holds the permit given back.
	Old string
	// Seq is Old's arrival order: the new ticket is served before every
	// ticket that arrived after it.
	Seq int64
}

// localUpstream names an upstream for a permit admitted without the
// store (fail open), round robin over those not cooling in the node
// (localCool: a fail-open permit's, or a requeue's while the store is
// down): no cluster-wide count applies to it, and the store's cooldowns
// are out of reach. Every upstream cooling, the one whose cooldown ends
// first: fail open admits.
func (q *Queue) localUpstream(cfg *Config) string {
	us := cfg.Upstreams
	if len(us) == 0 {
		return ""
	}
	n := int(q.rr.Add(1) % uint64(len(us)))
	now := time.Now()
	q.localMu.Lock()
	defer q.localMu.Unlock()
	first := -1
	var firstEnd time.Time
	for i := range us {
		j := (n + i) % len(us)
		end := q.localCool[us[j].Dial]
		if !now.Before(end) {
			return us[j].Dial
		}
		if first < 0 || end.Before(firstEnd) {
			first, firstEnd = j, end
		}
	}
	return us[first].Dial
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

// tokensOf maps the tickets of ts that weigh tokens to their weight
// under cfg (heldWeight: a store that counts one again, having lost it,
// counts it as its grant may have; nil when none weighs any).
func tokensOf(cfg *Config, ts ...[]*ticket) map[string]int {
	var m map[string]int
	for _, l := range ts {
		for _, t := range l {
			if w := heldWeight(cfg, t); w > 0 {
				if m == nil {
					m = make(map[string]int)
				}
				m[t.id] = w
			}
		}
	}
	return m
}

// WithShares sets the learned share of each upstream of us that has one
// in shares (by dial), adding the upstreams that have only a share; in
// dial order. For stores' Inspect.
func WithShares(us []UpstreamInfo, shares map[string]float64) []UpstreamInfo {
	for dial, share := range shares {
		if dial == "" {
			continue
		}
		i := slices.IndexFunc(us, func(u UpstreamInfo) bool { return u.Dial == dial })
		if i < 0 {
			us = append(us, UpstreamInfo{Dial: dial})
			i = len(us) - 1
		}
		us[i].LearnedShare = share
	}
	slices.SortFunc(us, func(a, b UpstreamInfo) int { return strings.Compare(a.Dial, b.Dial) })
	return us
}
