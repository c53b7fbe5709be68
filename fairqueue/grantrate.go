package fairqueue

import (
	"math"
	"sync"
	"time"
)

// rateWindow is how far back grantRate counts grants.
const rateWindow = time.Minute

// minRateGrants is how many grants the window needs before grantRate
// gives an estimate: one grant tells nothing of the next.
const minRateGrants = 2

// rateSample is the store's grant counter at one reconcile.
type rateSample struct {
	grants int64
	at     time.Time
}

// grantRate estimates how fast the queue grants permits, cluster-wide,
// from the store's grant counter read at each reconcile: the grants of
// the last rateWindow over the time they took. Long requests free their
// permits in bursts (an 8-second answer frees one permit once in eight
// seconds), so an average of the rates between two reconciles sinks
// toward zero between bursts and an ETA from it grows without bound;
// grants counted over a window of many of them do not.
type grantRate struct {
	mu      sync.Mutex
	samples []rateSample // oldest first, at least a second apart
	latest  rateSample
}

func (d *grantRate) sample(grants int64, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.samples) > 0 && (grants < d.latest.grants || at.Sub(d.latest.at) > rateWindow) {
		// The store's counter started over, or the node read nothing
		// for a whole window (reconcile runs while it has waiters): the
		// old samples would spread the new grants over the idle time.
		d.samples = d.samples[:0]
	}
	d.latest = rateSample{grants: grants, at: at}
	if n := len(d.samples); n > 0 && at.Sub(d.samples[n-1].at) < time.Second {
		return // bounds the samples kept, whatever the poll interval
	}
	d.samples = append(d.samples, d.latest)
	// Keep one sample at or before the window's start, so that the
	// window spans rateWindow once the queue has run that long.
	drop := 0
	for drop+1 < len(d.samples) && !d.samples[drop+1].at.After(at.Add(-rateWindow)) {
		drop++
	}
	d.samples = append(d.samples[:0], d.samples[drop:]...)
}

// perSecond is the grants per second over the window; 0 while unknown.
func (d *grantRate) perSecond() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.samples) == 0 {
		return 0
	}
	first := d.samples[0]
	n := d.latest.grants - first.grants
	span := d.latest.at.Sub(first.at).Seconds()
	if n < minRateGrants || span < 1 {
		return 0
	}
	return float64(n) / span
}

// retryAfter is the time for position grants at the observed rate,
// bounded to [1s, maxWait] (maxWait when the rate is unknown). Position 0
// (never queued) counts as 1.
func (d *grantRate) retryAfter(position int, maxWait time.Duration) time.Duration {
	rate := d.perSecond()
	hi := max(maxWait, time.Second)
	if rate <= 0 {
		return hi.Round(time.Second)
	}
	s := math.Round(float64(max(position, 1)) / rate)
	return min(max(time.Duration(s)*time.Second, time.Second), hi.Round(time.Second))
}

// eta is the time for position grants at the observed rate, rounded to
// the second; 0 when the rate is unknown.
func (d *grantRate) eta(position int) time.Duration {
	rate := d.perSecond()
	if rate <= 0 {
		return 0
	}
	return time.Duration(math.Round(float64(max(position, 1))/rate)) * time.Second
}
