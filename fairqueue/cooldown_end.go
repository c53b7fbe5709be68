package fairqueue

import (
	"slices"
	"sync"
	"time"
)

// The end of a cooldown hands on what its upstream kept: dispatch leaves
// a cooling upstream out (Permit.Cool, Permit.Requeue), so a permit freed
// on it meanwhile stays free, its waiters waiting, until a dispatch after
// the cooldown. The node that started a cooldown in the store reconciles
// as it ends (a reconcile dispatches to every instance's waiters), rather
// than leave it to the next poll of an instance with waiters, up to
// PollInterval later. One store call per cooldown, none on a request's
// path.

// coolEndSlack is how long after a cooldown's end, on the node's clock,
// its reconcile goes: the store started the cooldown when the call ran,
// before its answer started the node's timer; the slack covers the two
// clocks' rates.
const coolEndSlack = 2 * time.Millisecond

// coolEndMerge: a cooldown ending within this of one already noted is
// that one's (a burst of refusals from one upstream is one reconcile).
const coolEndMerge = 10 * time.Millisecond

// maxCoolEnds bounds the cooldown ends a node keeps; beyond it the
// latest are left to the polls.
const maxCoolEnds = 16

// coolEnds are the ends of the cooldowns the node started that have not
// come yet, and the timer set for the first.
type coolEnds struct {
	mu      sync.Mutex
	ends    []time.Time // ascending
	timer   *time.Timer
	stopped bool
}

// cooled notes a cooldown of d the node's store call started: the loop
// reconciles as it ends (evCoolEnd).
func (s *session) cooled(d time.Duration) {
	if d <= 0 {
		return
	}
	c := &s.coolEnds
	end := time.Now().Add(d + coolEndSlack)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	i, _ := slices.BinarySearchFunc(c.ends, end, time.Time.Compare)
	switch {
	case i > 0 && end.Sub(c.ends[i-1]) <= coolEndMerge:
		c.ends[i-1] = end // the later end: the upstream cools until then
		return
	case i < len(c.ends) && c.ends[i].Sub(end) <= coolEndMerge:
		return
	}
	c.ends = slices.Insert(c.ends, i, end)
	if len(c.ends) > maxCoolEnds {
		c.ends = c.ends[:maxCoolEnds]
	}
	if i == 0 {
		c.arm(s)
	}
}

// arm sets the timer for the first end. c.mu held.
func (c *coolEnds) arm(s *session) {
	d := time.Until(c.ends[0])
	if c.timer == nil {
		c.timer = time.AfterFunc(d, func() { c.fire(s) })
		return
	}
	c.timer.Reset(d)
}

// fire drops the ends that came, sets the timer for the next, and has
// the loop reconcile.
func (c *coolEnds) fire(s *session) {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	n := 0
	for n < len(c.ends) && !c.ends[n].After(now) {
		n++
	}
	c.ends = c.ends[n:]
	if len(c.ends) > 0 {
		c.arm(s)
	}
	c.mu.Unlock()
	if n > 0 {
		s.note(evCoolEnd, true)
	}
}

// stop drops every end: the node left.
func (c *coolEnds) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.ends = nil
	if c.timer != nil {
		c.timer.Stop()
	}
}
