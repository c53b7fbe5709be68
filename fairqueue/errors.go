package fairqueue

import (
	"errors"
	"fmt"
	"time"
)

// Reason says why a request was not granted a permit. It is the value of
// the Fair-Queue-Reason header, of log fields and of metric labels.
type Reason string

// The reasons a ticket can end without a grant.
const (
	// ReasonTimeout: the ticket waited its whole max wait.
	ReasonTimeout Reason = "timeout"
	// ReasonQueueFull: a queue length cap refused the ticket at once.
	ReasonQueueFull Reason = "queue_full"
	// ReasonShuttingDown: the queue is draining (process exit).
	ReasonShuttingDown Reason = "shutting_down"
	// ReasonStoreUnavailable: the store (Redis) could not be reached.
	ReasonStoreUnavailable Reason = "store_unavailable"
)

// Sentinel errors, one per Reason, for errors.Is.
var (
	ErrTimeout          = errors.New("fair queue: max wait exceeded")
	ErrQueueFull        = errors.New("fair queue: queue full")
	ErrShuttingDown     = errors.New("fair queue: shutting down")
	ErrStoreUnavailable = errors.New("fair queue: store unavailable")
	// ErrStoreBusy is wrapped by a store error that says this process is
	// overloaded (e.g. every client connection busy), not that the store
	// is down: it does not count against the store's health, and Acquire
	// retries the call until the max wait.
	ErrStoreBusy = errors.New("fair queue: store client busy")
)

// RejectError is returned by Queue.Acquire when a ticket ends without a
// grant for a reason other than its context ending. errors.Is matches it
// against the sentinel of its Reason.
type RejectError struct {
	Reason Reason
	// Waited is how long the ticket was in the queue.
	Waited time.Duration
	// Position is the last known number of tickets ahead of it, plus one
	// (1 = next in line); 0 when it never entered the queue.
	Position int
	// RetryAfter estimates when a new attempt could be granted, from the
	// queue's observed grant rate; always at least one second.
	RetryAfter time.Duration
	// Err is the underlying cause (a store error), if any.
	Err error
}

// Error describes the rejection: its reason, wait and position.
func (e *RejectError) Error() string {
	msg := fmt.Sprintf("fair queue: %s after %s (position %d)", e.Reason, e.Waited.Round(time.Millisecond), e.Position)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is the sentinel error of e's Reason.
func (e *RejectError) Is(target error) bool {
	return target == sentinel(e.Reason)
}

// Unwrap returns the underlying store error, if any.
func (e *RejectError) Unwrap() error { return e.Err }

func sentinel(r Reason) error {
	switch r {
	case ReasonTimeout:
		return ErrTimeout
	case ReasonQueueFull:
		return ErrQueueFull
	case ReasonShuttingDown:
		return ErrShuttingDown
	case ReasonStoreUnavailable:
		return ErrStoreUnavailable
	}
	return nil
}

// ReasonOf returns the Reason carried by err, or "" when err is not a
// RejectError.
func ReasonOf(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}
