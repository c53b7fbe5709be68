package mockllm

import "time"

// maxHandoffGaps bounds Stats.HandoffGapsUS, and maxPendingEnds the
// completion ends waiting for a next arrival, so that a long run cannot
// grow them without limit.
const (
	maxHandoffGaps = 200_000
	maxPendingEnds = 4096
)

// timeline keeps what Config.Timeline reports: the ends of completions
// not yet followed by an arrival. Its methods run under Server.mu.
type timeline struct {
	pending []time.Time // oldest first
}

// arrive matches a completion request arriving at now with the oldest
// completion end not yet matched, and records the gap between them.
func (tl *timeline) arrive(st *Stats, now time.Time) {
	if len(tl.pending) == 0 {
		return
	}
	end := tl.pending[0]
	tl.pending = tl.pending[1:]
	if len(st.HandoffGapsUS) < maxHandoffGaps {
		st.HandoffGapsUS = append(st.HandoffGapsUS, now.Sub(end).Microseconds())
	}
}

// leave records the end, at now, of a completion that arrived at arrived.
func (tl *timeline) leave(st *Stats, arrived, now time.Time) {
	st.BusyMS += float64(now.Sub(arrived)) / float64(time.Millisecond)
	if len(tl.pending) == maxPendingEnds {
		tl.pending = tl.pending[1:]
	}
	tl.pending = append(tl.pending, now)
}

// reset forgets the completion ends seen so far.
func (tl *timeline) reset() { tl.pending = nil }
