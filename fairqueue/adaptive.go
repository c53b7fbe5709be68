package fairqueue

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Adaptive makes the queue learn its capacity from what the backend
// shows (Config.Adaptive): the capacity in force is a share of the
// configured one (Permits, KVTokens and each upstream's, all alike),
// between Floor and 1, one value in the store for every node of the
// queue. The control law is AIMD on the time to first token (TTFT):
//
//   - every node reports, per Interval, how many TTFTs it measured, how
//     many were above TargetTTFT, how many requests the upstream refused
//     (429/503) and whether its requests had to wait (the capacity was
//     the limit);
//   - the store folds every node's reports and moves the share at most
//     once per Interval, by its own clock: down to Decrease times it when
//     more than BreachShare of the TTFTs were above the target or any
//     request was refused; up by Step when none was and the capacity was
//     the limit (growing a capacity nobody reaches would only let a later
//     burst through); else it stays.
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
	// a breach, in [0, 1). Default 0.01 (the target is a p99).
	BreachShare float64 `json:"breach_share,omitempty"`
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
	return a
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
	case !(a.BreachShare >= 0 && a.BreachShare < 1):
		return fmt.Errorf("adaptive: breach_share must be in [0, 1), got %v", a.BreachShare)
	}
	return nil
}

// Adapter is a Store that keeps a learned capacity (Config.Adaptive):
// one share per queue, moved by every node's reports. Calls carrying
// Limits.Learned grant under that share of their limits.
type Adapter interface {
	// Adapt adds one node's report to the queue's window and, when an
	// interval has passed since the last move (the store's clock), moves
	// the share by the window's reports and starts a new window. It
	// returns the share in force.
	Adapt(ctx context.Context, a AdaptArgs) (float64, error)
}

// AdaptArgs is one node's report for one interval.
type AdaptArgs struct {
	Node string
	// Samples is the TTFTs measured, Over those above the target.
	Samples, Over int
	// Refused counts the requests the upstream refused (429/503).
	Refused int
	// Limited: requests had to wait for capacity in the interval.
	Limited bool
	// The law's settings (Adaptive, after defaults).
	Floor, Decrease, Step, BreachShare float64
	Interval                           time.Duration
}

// Scale returns l with the learned share applied: what a store that
// keeps share grants under. At least one permit; a token capacity at
// least 1; per upstream alike.
func (l Limits) Scale(share float64) Limits {
	if !l.Learned || !(share > 0) || share >= 1 {
		return l
	}
	sc := func(n int) int {
		if n <= 0 {
			return n
		}
		return max(int(math.Floor(float64(n)*share)), 1)
	}
	l.Permits, l.Tokens = sc(l.Permits), sc(l.Tokens)
	if len(l.Upstreams) > 0 {
		ups := make([]Upstream, len(l.Upstreams))
		for i, u := range l.Upstreams {
			ups[i] = Upstream{Dial: u.Dial, Permits: sc(u.Permits), KVTokens: sc(u.KVTokens)}
		}
		l.Upstreams = ups
	}
	return l
}

// NextShare is the law (Adaptive): the share after a window, from the
// share before and the window's folded reports. Both stores use it (the
// Redis store's script has the same lines).
func NextShare(share float64, samples, over, refused int, limited bool, a AdaptArgs) float64 {
	switch {
	case refused > 0 || (samples > 0 && float64(over) > a.BreachShare*float64(samples)):
		share *= a.Decrease
	case limited && samples > 0:
		share += a.Step
	}
	return min(max(share, a.Floor), 1)
}

// learner is a Queue's side of Adaptive: the interval's observations,
// sent with the first observation after the interval ends.
type learner struct {
	samples, over, refused atomic.Int64
	limited                atomic.Bool
	sent                   atomic.Int64  // when the last report was sent (Unix ns)
	share                  atomic.Uint64 // the share in force, float64 bits; 0: 1
}

// Share returns the learned share of the configured capacity in force
// (1 without Config.Adaptive, or before the store answered).
func (q *Queue) Share() float64 {
	if s := math.Float64frombits(q.learn.share.Load()); s > 0 {
		return s
	}
	return 1
}

// ObserveTTFT records one granted request's time to first token (from
// forwarding it to its first response byte), for Config.Adaptive; a
// no-op without it. Safe from any goroutine; it never blocks.
func (q *Queue) ObserveTTFT(d time.Duration) {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil {
		return
	}
	q.learn.samples.Add(1)
	if d > cfg.Adaptive.TargetTTFT {
		q.learn.over.Add(1)
	}
	q.maybeAdapt(cfg)
}

// ObserveRefused records a request the upstream refused (429/503), for
// Config.Adaptive; a no-op without it.
func (q *Queue) ObserveRefused() {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil {
		return
	}
	q.learn.refused.Add(1)
	q.maybeAdapt(cfg)
}

// maybeAdapt sends the interval's report in the background once the
// interval has passed since the last one.
func (q *Queue) maybeAdapt(cfg *Config) {
	ad, ok := q.store.(Adapter)
	if !ok {
		return
	}
	a := cfg.Adaptive.withDefaults()
	now := time.Now().UnixNano()
	last := q.learn.sent.Load()
	if now-last < int64(a.Interval) || !q.learn.sent.CompareAndSwap(last, now) {
		return
	}
	args := AdaptArgs{Node: q.node, Samples: int(q.learn.samples.Swap(0)), Over: int(q.learn.over.Swap(0)),
		Refused: int(q.learn.refused.Swap(0)), Limited: q.learn.limited.Swap(false),
		Floor: a.Floor, Decrease: a.Decrease, Step: a.Step, BreachShare: a.BreachShare, Interval: a.Interval}
	q.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		defer cancel()
		share, err := ad.Adapt(ctx, args)
		q.health.record(q.log, err)
		if err == nil {
			q.learn.share.Store(math.Float64bits(share))
		}
	})
}
