package fairqueue

import (
	"slices"
	"strings"
	"time"
)

// What a node observes for its learned capacity (Adaptive): each
// forwarded request's answer and each reading of the backend's gauges,
// added to the interval's reports by share key (learner), sent by
// maybeAdapt.

// ObserveTTFT records one granted request's time to first token (from
// forwarding it to its first response byte) on upstream (its
// Permit.Upstream; "" without a pool), for Config.Adaptive; a no-op
// without it. Safe from any goroutine; it never blocks on the store.
func (q *Queue) ObserveTTFT(upstream string, d time.Duration) {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil {
		return
	}
	q.learn.add(upstream, func(r *AdaptReport) {
		r.Samples++
		if d > cfg.Adaptive.TargetTTFT {
			r.Over++
		}
	})
	q.maybeAdapt(cfg)
}

// ObserveAnswered records an answer of upstream ("" without a pool)
// that succeeded without being timed (a plain answer, whose first byte
// comes after the whole generation), for Config.Adaptive: no time to
// first token, but no refusal (AdaptReport.Answered). A no-op without
// Adaptive.
func (q *Queue) ObserveAnswered(upstream string) {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil {
		return
	}
	q.learn.add(upstream, func(r *AdaptReport) { r.Answered++ })
	q.maybeAdapt(cfg)
}

// ObserveUnanswered records a granted request whose first response byte
// had not come d after it was forwarded, when its client or the proxy
// gave up waiting, for Config.Adaptive: its time to first token is
// longer than d, so one above the target when d is (left out, the
// slowest first tokens would never count, and a backend that answers
// none in time none at all); when d is not, it says nothing, and
// nothing is recorded. A no-op without Adaptive.
func (q *Queue) ObserveUnanswered(upstream string, d time.Duration) {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil || d <= cfg.Adaptive.TargetTTFT {
		return
	}
	q.learn.add(upstream, func(r *AdaptReport) {
		r.Samples++
		r.Over++
	})
	q.maybeAdapt(cfg)
}

// ObserveRefused records a request that upstream ("" without a pool)
// refused (429/503), for Config.Adaptive; a no-op without it.
func (q *Queue) ObserveRefused(upstream string) {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil {
		return
	}
	q.learn.add(upstream, func(r *AdaptReport) { r.Refused++ })
	q.maybeAdapt(cfg)
}

// ObserveOverload records one reading of upstream's ("" without a pool)
// own gauges that showed n signs that it runs more than it should
// (requests it preempted, requests queued in it; 0: none), for
// Config.Adaptive: the reading counts as one sample of the window, and
// each sign as a TTFT above the target, judged with the window's other
// samples (BreachShare, MinSamples). A queue whose clients never stream
// (no TTFT measured) learns from its readings so: down while they show
// overload, up while they show none and requests wait. A no-op without
// Adaptive.
func (q *Queue) ObserveOverload(upstream string, n int) {
	cfg := q.cfg.Load()
	if cfg.Adaptive == nil || n < 0 {
		return
	}
	q.learn.add(upstream, func(r *AdaptReport) {
		r.Samples++
		r.Over += n
	})
	q.maybeAdapt(cfg)
}

func (l *learner) add(key string, f func(*AdaptReport)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.obs == nil {
		l.obs = make(map[string]*AdaptReport)
	}
	r := l.obs[key]
	if r == nil {
		r = &AdaptReport{Key: key}
		l.obs[key] = r
	}
	f(r)
}

// pending says whether anything was observed since the last take.
func (l *learner) pending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.obs) > 0
}

// take returns the interval's reports and starts a new interval.
func (l *learner) take() []AdaptReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]AdaptReport, 0, len(l.obs))
	for _, r := range l.obs {
		out = append(out, *r)
	}
	l.obs = nil
	slices.SortFunc(out, func(a, b AdaptReport) int { return strings.Compare(a.Key, b.Key) })
	return out
}
