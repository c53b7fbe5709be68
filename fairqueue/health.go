package fairqueue

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

var errStoreDown = errors.New("store marked down after consecutive failures")

// health is the store's up/down state: down after downAfter consecutive
// failed calls, up again after one success. One failure does not flip it.
type health struct {
	onFail    func(error)
	downAfter atomic.Int32
	fails     atomic.Int32
	down      atomic.Bool
}

func (h *health) up() bool { return !h.down.Load() }

func (h *health) record(log *zap.Logger, err error) {
	if err == nil {
		h.ok(log)
	} else if !errors.Is(err, errClosed) && !errors.Is(err, ErrStoreBusy) {
		h.failed(log, err)
	}
}

func (h *health) ok(log *zap.Logger) {
	h.fails.Store(0)
	if h.down.CompareAndSwap(true, false) {
		log.Info("store reachable again")
	}
}

func (h *health) failed(log *zap.Logger, err error) {
	if h.onFail != nil {
		h.onFail(err)
	}
	if h.fails.Add(1) >= h.downAfter.Load() && h.down.CompareAndSwap(false, true) {
		log.Error("store unreachable; applying on_store_error policy", zap.Error(err))
	}
}

// outage marks the store down now, unless err says the store is not at
// fault (a closed queue, a busy client pool): a request was answered by
// the on_store_error policy. Up again after one success, as always.
func (h *health) outage(log *zap.Logger, err error) {
	if errors.Is(err, errClosed) || errors.Is(err, ErrStoreBusy) {
		return
	}
	if h.down.CompareAndSwap(false, true) {
		log.Error("store unreachable; applying on_store_error policy", zap.Error(err))
	}
}

// drainRate estimates how fast the queue grants permits, from samples of
// the store's grant counter, to answer "retry after how long?".
type drainRate struct {
	mu     sync.Mutex
	last   int64
	lastAt time.Time
	rate   float64 // grants per second, exponentially weighted
}

func (d *drainRate) sample(grants int64, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastAt.IsZero() || grants < d.last {
		d.last, d.lastAt = grants, at
		return
	}
	dt := at.Sub(d.lastAt).Seconds()
	if dt < 0.5 {
		return
	}
	r := float64(grants-d.last) / dt
	if d.rate == 0 {
		d.rate = r
	} else {
		d.rate = 0.7*d.rate + 0.3*r
	}
	d.last, d.lastAt = grants, at
}

// retryAfter is the time for position grants at the observed rate,
// bounded to [1s, maxWait] (maxWait when the rate is unknown). Position 0
// (never queued) counts as 1.
func (d *drainRate) retryAfter(position int, maxWait time.Duration) time.Duration {
	d.mu.Lock()
	rate := d.rate
	d.mu.Unlock()
	hi := max(maxWait, time.Second)
	if rate <= 0 {
		return hi.Round(time.Second)
	}
	s := math.Round(float64(max(position, 1)) / rate)
	return min(max(time.Duration(s)*time.Second, time.Second), hi.Round(time.Second))
}

// eta is the time for position grants at the observed rate, rounded to
// the second; 0 when the rate is unknown.
func (d *drainRate) eta(position int) time.Duration {
	d.mu.Lock()
	rate := d.rate
	d.mu.Unlock()
	if rate <= 0 {
		return 0
	}
	return time.Duration(math.Round(float64(max(position, 1))/rate)) * time.Second
}
