package fairqueue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestGrantRateOfLongAnswersStaysNearTheirRate feeds the estimator what
// reconcile reads behind one permit and 8-second answers: a grant every
// 8 s, read every 500 ms. The ETA of the next waiter stays near 8 s all
// along, and a timeout's Retry-After says when the next permit frees.
func TestGrantRateOfLongAnswersStaysNearTheirRate(t *testing.T) {
	var d grantRate
	start := time.Unix(1_000_000, 0)
	grants := int64(0)
	for tick := range 600 { // five minutes
		at := start.Add(time.Duration(tick) * 500 * time.Millisecond)
		if tick > 0 && tick%16 == 0 {
			grants++
		}
		d.sample(grants, at)
		if at.Sub(start) < 40*time.Second {
			continue // warming up: the window holds few grants, and the time before the first
		}
		eta := d.eta(1)
		assert.True(t, eta >= 6*time.Second && eta <= 11*time.Second, "at %s: eta %s for the next waiter", at.Sub(start), eta)
		assert.True(t, d.eta(3) >= 3*eta-time.Second, "the eta grows with the position")
		retry := d.retryAfter(1, 10*time.Second)
		assert.True(t, retry >= 6*time.Second && retry <= 10*time.Second, "at %s: retry after %s", at.Sub(start), retry)
	}
	assert.LessOrEqual(t, len(d.samples), int(rateWindow/time.Second)+2, "samples kept a second apart over the window")
}

func TestGrantRateIsUnknownUntilTwoGrants(t *testing.T) {
	var d grantRate
	start := time.Unix(1_000_000, 0)
	d.sample(5, start)
	d.sample(6, start.Add(3*time.Second))
	assert.Zero(t, d.eta(1), "one grant tells nothing")
	assert.Equal(t, 10*time.Second, d.retryAfter(1, 10*time.Second), "unknown: max_wait")
	d.sample(7, start.Add(4*time.Second))
	assert.Equal(t, 2*time.Second, d.eta(1))
}

// TestGrantRateAfterAnIdleSpellCountsOnlyTheNewGrants: a node that had
// no waiter for half an hour read no sample meanwhile; its first minute
// back does not spread the new grants over the idle time.
func TestGrantRateAfterAnIdleSpellCountsOnlyTheNewGrants(t *testing.T) {
	var d grantRate
	start := time.Unix(1_000_000, 0)
	for i := range 60 {
		d.sample(int64(i), start.Add(time.Duration(i)*time.Second))
	}
	back := start.Add(30 * time.Minute)
	for i := range 10 {
		d.sample(int64(60+i), back.Add(time.Duration(i)*time.Second))
	}
	assert.InDelta(t, 1, d.perSecond(), 0.01, "one grant a second since the node is back")
}

func TestGrantRateStartsOverWhenTheStoreCounterDoes(t *testing.T) {
	var d grantRate
	start := time.Unix(1_000_000, 0)
	for i := range 10 {
		d.sample(int64(100+10*i), start.Add(time.Duration(i)*time.Second))
	}
	assert.InDelta(t, 10, d.perSecond(), 0.01)
	d.sample(0, start.Add(11*time.Second)) // a flushed store
	assert.Zero(t, d.eta(1))
}
