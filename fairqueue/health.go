package fairqueue

import (
	"errors"
	"sync/atomic"

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
