package fairqueue

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive makes the queue learn its capacity from what the backend
// shows (Config.Adaptive): the capacity in force is a share of the
// configured one, between Floor and 1, one value in the store for every
// node of the queue: without a pool, one share of Permits and KVTokens;
// with one, a share per upstream of its Permits and KVTokens, learned
// from that upstream's answers alone. The control law is AIMD on the
// time to first token (TTFT):
//
//   - every node reports, per Interval and per upstream, how many TTFTs
//     it measured, how many were above TargetTTFT (with the signs of
//     overload the upstream's own gauges showed: ObserveOverload), how
//     many requests the upstream refused (429/503), and whether its
//     requests had to wait (the capacity was the limit);
//   - the store folds every node's reports and moves each share at most
//     once per Interval, by its own clock, and only once the window holds
//     enough samples to judge the target (MinSamples) or a refusal: down to Decrease times it when
//     more than BreachShare of the TTFTs were above the target or any
//     request was refused; up by Step when none was and the capacity was
//     the limit (growing a capacity nobody reaches would only let a later
//     burst through); else it stays. A window without a TTFT is ripe
//     with MinSamples answers that succeeded untimed (ObserveAnswered):
//     a queue whose clients never stream climbs back after refusals.
//
// At a steady load the share saw-tooths between the knee and Decrease
// times it (10% by default). Lowering never revokes a running request;
// it only delays the next grants.
type Adaptive struct {
	// TargetTTFT is the time to first token to keep at or below: from
	// forwarding a granted request to its first response byte (a
	// stream's first chunk). Required.
	TargetTTFT time.Duration `json:"target_ttft"`
	// Floor is the least share of the configured capacity in force, in
	// (0, 1]. Default 1/16, and at least one permit.
	Floor float64 `json:"floor,omitempty"`
	// Interval is how often the capacity may move, cluster-wide, and how
	// often each node reports. Default 1s, at least 100ms.
	Interval time.Duration `json:"interval,omitempty"`
	// Decrease is the factor a breach multiplies the share by, in
	// (0, 1). Default 0.9.
	Decrease float64 `json:"decrease,omitempty"`
	// Step is what an interval under the target adds to the share, in
	// (0, 1]. Default 1/64 (with permits 64, one permit a second).
	Step float64 `json:"step,omitempty"`
	// BreachShare is the share of TTFTs above the target that counts as
	// a breach, in (0, 1). Default 0.01 (the target is a p99); 0 is
	// unset, the default.
	BreachShare float64 `json:"breach_share,omitempty"`
	// MinSamples is how many TTFTs a window needs before the target is
	// judged (a refusal moves the share at once): a p99 judged on ten
	// samples is noise. Default 1/BreachShare, within 10..100.
	MinSamples int `json:"min_samples,omitempty"`
	// BackendMetrics is where the caller reads the backend's own gauges
	// (the Caddy handler: vLLM's or SGLang's /metrics; see
	// ObserveOverload). The engine does not read it.
	BackendMetrics string `json:"backend_metrics,omitempty"`
}

// Adaptive defaults.
const (
	DefaultAdaptiveFloor       = 1.0 / 16
	DefaultAdaptiveInterval    = time.Second
	MinAdaptiveInterval        = 100 * time.Millisecond
	DefaultAdaptiveDecrease    = 0.9
	DefaultAdaptiveStep        = 1.0 / 64
	DefaultAdaptiveBreachShare = 0.01
)

func (a Adaptive) withDefaults() Adaptive {
	if a.Floor == 0 {
		a.Floor = DefaultAdaptiveFloor
	}
	if a.Interval == 0 {
		a.Interval = DefaultAdaptiveInterval
	}
	if a.Decrease == 0 {
		a.Decrease = DefaultAdaptiveDecrease
	}
	if a.Step == 0 {
		a.Step = DefaultAdaptiveStep
	}
	if a.BreachShare == 0 {
		a.BreachShare = DefaultAdaptiveBreachShare
	}
	if a.MinSamples == 0 {
		a.MinSamples = min(max(int(math.Ceil(1/a.BreachShare)), 10), 100)
	}
	return a
}

// isHTTPURL reports whether s is an absolute http or https URL with a
// host: what Adaptive.BackendMetrics names a backend by.
func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func (a Adaptive) validate() error {
	a = a.withDefaults()
	switch {
	case a.TargetTTFT <= 0:
		return fmt.Errorf("adaptive: target_ttft is required and must be positive, got %s", a.TargetTTFT)
	case !(a.Floor > 0 && a.Floor <= 1):
		return fmt.Errorf("adaptive: floor must be in (0, 1], got %v", a.Floor)
	case a.Interval < MinAdaptiveInterval:
		return fmt.Errorf("adaptive: interval must be at least %s, got %s", MinAdaptiveInterval, a.Interval)
	case !(a.Decrease > 0 && a.Decrease < 1):
		return fmt.Errorf("adaptive: decrease must be in (0, 1), got %v", a.Decrease)
	case !(a.Step > 0 && a.Step <= 1):
		return fmt.Errorf("adaptive: step must be in (0, 1], got %v", a.Step)
	case !(a.BreachShare > 0 && a.BreachShare < 1):
		return fmt.Errorf("adaptive: breach_share must be in (0, 1), got %v", a.BreachShare)
	case a.MinSamples < 1:
		return fmt.Errorf("adaptive: min_samples must be at least 1, got %d", a.MinSamples)
	}
	return nil
}

// Adapter is a Store that keeps a learned capacity (Config.Adaptive):
// shares per queue, moved by every node's reports. Calls carrying
// Limits.Learned grant under them (Limits.Scale).
type Adapter interface {
	// Adapt adds one node's reports to the queue's windows and, for each
	// share an interval has passed since it last moved (the store's
	// clock), moves it by its window's reports and starts a new window.
	// It returns every share in force, by key. It does not lower the
	// queue's share (key "") while heads named under a learned capacity
	// (HeadListener; the in-process store notes where the Redis store
	// names them) to a node other than a.Node may still serve (HeadsTTL):
	// the window keeps the reports, and a later report moves the share.
	Adapt(ctx context.Context, a AdaptArgs) (map[string]float64, error)
}

// AdaptArgs is one node's report for one interval.
type AdaptArgs struct {
	Node string
	// Reports are the node's observations, one per share: key "" is the
	// queue's (no pool), an upstream's dial address its own.
	Reports []AdaptReport
	// Limited: requests had to wait for capacity in the interval.
	Limited bool
	// The law's settings (Adaptive, after defaults).
	Floor, Decrease, Step, BreachShare float64
	Interval                           time.Duration
	MinSamples                         int
	// Known are the shares the node last heard of (Queue.Shares): a
	// reported key whose share the store lacks while the node knows one
	// below 1 (the store lost its data: a restart without persistence, a
	// failover) starts from the node's, not from the ceiling.
	Known map[string]float64
}

// KnownShare is the share a store that lacks key's starts it from
// (AdaptArgs.Known): the node's, where it knows one in (0, 1); else 0,
// none (the ceiling).
func (a AdaptArgs) KnownShare(key string) float64 {
	if s, ok := a.Known[key]; ok && s > 0 && s < 1 {
		return s
	}
	return 0
}

// AdaptReport is what a node saw of one share's requests in an interval.
type AdaptReport struct {
	Key string
	// Samples is the TTFTs measured, Over those above the target.
	Samples, Over int
	// Refused counts the requests the upstream refused (429/503).
	Refused int
	// Answered counts the answers that succeeded without being timed (a
	// plain answer, ObserveAnswered): no time to first token, but no
	// refusal either. A window without a TTFT that holds MinSamples of
	// them may move its share up (a queue whose clients never stream
	// climbs back after refusals); they never count toward a breach.
	Answered int
}

// Scale returns l with the learned shares applied: what a store that
// keeps them grants under. Key "" scales Permits and Tokens, an
// upstream's dial its Permits and KVTokens; at least 1 each.
func (l Limits) Scale(shares map[string]float64) Limits {
	if !l.Learned || len(shares) == 0 {
		return l
	}
	sc := func(n int, key string) int {
		share, ok := shares[key]
		if n <= 0 || !ok || !(share > 0) || share >= 1 {
			return n
		}
		return max(int(math.Floor(float64(n)*share)), 1)
	}
	if len(l.Upstreams) == 0 {
		// The queue's share is learned without a pool only: with one,
		// each upstream's applies (a queue share left from before a
		// reload added the pool is reported by nobody and never moves).
		l.Permits, l.Tokens = sc(l.Permits, ""), sc(l.Tokens, "")
	}
	// The bound on one ticket follows the largest share in force, and the
	// largest capacity in force (below): a heavy ticket still fits,
	// alone, where the capacity is largest. The shares
	// in force are the queue's without a pool, each upstream's with one;
	// a key without a share is at 1 (all of it).
	most := 0.0
	keys := []string{""}
	if len(l.Upstreams) > 0 {
		keys = keys[:0]
		for _, u := range l.Upstreams {
			keys = append(keys, u.Dial)
		}
	}
	for _, k := range keys {
		s, ok := shares[k]
		if !ok || !(s > 0) {
			s = 1
		}
		most = max(most, s)
	}
	bound := l.TokenBound
	if bound > 0 && most > 0 && most < 1 {
		l.TokenBound = max(int(math.Floor(float64(bound)*most)), 1)
	}
	// With a pool whose every upstream sets its own KVTokens, the largest
	// capacity in force is the largest of theirs, each under its own
	// share: unequal caches make it another upstream's than the one of
	// the largest share (a large cache learned down beside a small one at
	// all of its own), and a ticket bounded above it would fit nowhere.
	if bound > 0 && len(l.Upstreams) > 0 {
		inForce := 0
		for _, u := range l.Upstreams {
			if u.KVTokens == 0 {
				inForce = 0 // bounded by the queue's capacity alone
				break
			}
			if u.KVTokens > 0 {
				inForce = max(inForce, sc(min(u.KVTokens, bound), u.Dial))
			}
		}
		if inForce > 0 {
			l.TokenBound = min(l.TokenBound, inForce)
		}
	}
	if len(l.Upstreams) > 0 {
		ups := make([]Upstream, len(l.Upstreams))
		for i, u := range l.Upstreams {
			ups[i] = Upstream{Dial: u.Dial, Permits: sc(u.Permits, u.Dial), KVTokens: sc(u.KVTokens, u.Dial)}
		}
		l.Upstreams = ups
	}
	return l
}

// Ripe reports whether a window may move its share (Adaptive): a
// refusal, enough samples to judge the target, or, in a window without
// a sample, enough answers that succeeded untimed (AdaptReport.Answered).
// The interval is the store's to check.
func Ripe(samples, refused, answered int, a AdaptArgs) bool {
	return refused > 0 || samples >= a.MinSamples || samples == 0 && answered >= a.MinSamples
}

// NextShare is the law (Adaptive): a share after a ripe window, from the
// share before and the window's folded reports. Both stores use it (the
// Redis store's script has the same lines).
func NextShare(share float64, samples, over, refused, answered int, limited bool, a AdaptArgs) float64 {
	switch {
	case Breached(samples, over, refused, a):
		share *= a.Decrease
	case limited && (samples > 0 || answered > 0):
		share += a.Step
	}
	return min(max(share, a.Floor), 1)
}

// Breached says whether a share's window lowers it (NextShare): a
// request was refused, or more than BreachShare of the TTFTs measured
// were above the target.
func Breached(samples, over, refused int, a AdaptArgs) bool {
	return refused > 0 || (samples > 0 && float64(over) > a.BreachShare*float64(samples))
}

// learner is a Queue's side of Adaptive: the interval's observations by
// share key, sent with the first observation after the interval ends.
type learner struct {
	mu      sync.Mutex
	obs     map[string]*AdaptReport
	limited atomic.Bool
	sent    atomic.Int64 // when the last report was sent (Unix ns)
	// sending: a report (or a restore) is on its way. One at a time: two
	// on their way at once may run in one order and have their replies
	// read in the other, the older share kept. The next goes once its
	// reply is read, with whatever was observed meanwhile.
	sending atomic.Bool
	// restore: the store lost its data; the shares the node knows are to
	// be sent (restoreShares) once no report is on its way.
	restore atomic.Bool
	shares  atomic.Pointer[map[string]float64] // the shares in force, as the store last said
	// moved is when the shares last changed here (ns since the session's
	// base, on the monotonic clock): a reply to a call sent before then
	// may have been chosen under the shares before (Queue.Heads).
	moved atomic.Int64
	// failed is when a report last failed here (ns since the session's
	// base): heads named by a call sent before then may have been chosen
	// under a share it lowered (Queue.doubtHeads).
	failed atomic.Int64
}

// Shares returns the learned shares of the configured capacity in force,
// by key ("": the queue's; an upstream's dial: its own), as the store
// last said; empty without Config.Adaptive or before it answered. A key
// missing is a share of 1.
func (q *Queue) Shares() map[string]float64 {
	if m := q.learn.shares.Load(); m != nil {
		return maps.Clone(*m)
	}
	return nil
}

// Share returns the least of Shares (1 when there is none).
func (q *Queue) Share() float64 {
	least := 1.0
	if m := q.learn.shares.Load(); m != nil {
		for _, s := range *m {
			least = min(least, s)
		}
	}
	return least
}

// maybeAdapt sends the interval's reports in the background once the
// interval has passed since the last one.
func (q *Queue) maybeAdapt(cfg *Config) {
	ad, ok := q.store.(Adapter)
	if !ok {
		return
	}
	if !q.s.isOpen() {
		// A node that never joined reports nothing: its leave would not
		// clean up. Nor does it keep what it saw (the backend's gauges,
		// read while no request came): by its first report, that would
		// be old, judged as the backend now.
		q.learn.take()
		return
	}
	a := cfg.Adaptive.withDefaults()
	now := time.Now().UnixNano()
	if now-q.learn.sent.Load() < int64(a.Interval) || !q.learn.sending.CompareAndSwap(false, true) {
		return // too soon; or one is on its way: what was observed goes once it is answered
	}
	q.learn.sent.Store(now)
	q.sendAdapt(ad, cfg, q.learn.take(), q.learn.limited.Swap(false))
}

// adaptSent is called once a report's reply is read (or the report was
// not sent): the next may go, a restore the store needs first, then what
// was observed meanwhile where an interval has passed since the last.
func (q *Queue) adaptSent() {
	q.learn.sending.Store(false)
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil {
		return
	}
	q.sendRestore(cfg)
	if q.learn.pending() {
		q.maybeAdapt(cfg)
	}
}

// restoreShares tells the store, after it lost its data (a heartbeat
// found a new data set), the shares the node last heard of, for the keys
// its config reports under: the store starts them from there, not from
// the ceiling (AdaptArgs.Known). The first node to tell it sets them; a
// node's report does so too, if it comes first.
func (q *Queue) restoreShares(cfg *Config) {
	q.learn.restore.Store(true)
	q.sendRestore(cfg)
}

// sendRestore sends the restore restoreShares asked for, unless a report
// is on its way (adaptSent sends it after).
func (q *Queue) sendRestore(cfg *Config) {
	if !q.learn.restore.Load() || !q.learn.sending.CompareAndSwap(false, true) {
		return
	}
	if !q.learn.restore.Swap(false) {
		q.learn.sending.Store(false)
		return
	}
	ad, ok := q.store.(Adapter)
	m := q.learn.shares.Load()
	if !ok || cfg.Adaptive == nil || m == nil {
		q.learn.sending.Store(false)
		return
	}
	keys := []string{""}
	if len(cfg.Upstreams) > 0 {
		keys = keys[:0]
		for _, u := range cfg.Upstreams {
			keys = append(keys, u.Dial)
		}
	}
	var reports []AdaptReport
	for _, k := range keys {
		if s, ok := (*m)[k]; ok && s < 1 {
			reports = append(reports, AdaptReport{Key: k}) // nothing observed: the window does not move
		}
	}
	if len(reports) == 0 {
		q.learn.sending.Store(false)
		return
	}
	q.sendAdapt(ad, cfg, reports, false)
}

// sendAdapt sends reports to the store in the background, with the
// shares the node knows, and keeps the shares its reply says; the caller
// set learner.sending, which adaptSent clears once the reply is read.
func (q *Queue) sendAdapt(ad Adapter, cfg *Config, reports []AdaptReport, limited bool) {
	a := cfg.Adaptive.withDefaults()
	args := AdaptArgs{Node: q.node, Reports: reports, Limited: limited,
		Floor: a.Floor, Decrease: a.Decrease, Step: a.Step, BreachShare: a.BreachShare, Interval: a.Interval,
		MinSamples: a.MinSamples, Known: q.Shares()}
	q.background(func() {
		defer q.adaptSent()
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		defer cancel()
		shares, err := ad.Adapt(ctx, args)
		if err != nil {
			// The call may have run and its reply been lost (a timeout):
			// this report may have lowered the share, which the node
			// would not hear of. Before the error is recorded: whoever
			// sees it sees the heads dropped.
			q.doubtHeads()
		}
		q.health.record(q.log, err)
		if err == nil {
			if old := q.learn.shares.Load(); old == nil || !maps.Equal(*old, shares) {
				// Before the shares: whoever reads the new shares reads this.
				q.learn.moved.Store(int64(time.Since(q.s.base)))
			}
			q.learn.shares.Store(&shares)
		}
	})
}
