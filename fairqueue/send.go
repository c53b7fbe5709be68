package fairqueue

import (
	"context"
	"errors"
	"time"
)

// send asks the store to grant or queue t. A failed call is sent again
// (the scripts are idempotent by ticket) while the store is still up and
// the deadline allows: one failure or a busy client pool is not an
// outage, so on_store_error does not apply to it. fresh reports whether
// the answer came less than a lease after its call was sent
// (answeredInLease); permits, the permits setting of the call answered
// (sent again, it carries the settings in force then: a grant at once
// was made under those).
func (q *Queue) send(ctx context.Context, t *ticket, req Request, cfg *Config, deadline time.Time) (res AcquireResult, fresh bool, permits int, err error) {
	t.scale = req.scale(cfg.PriorityFactor)
	t.cost = charge(clampCost(req.Cost), t.scale)
	t.tokens, _ = cfg.ClampTokens(req.Tokens)
	t.asks = asks(req.Tokens, t.tokens)
	args := TicketArgs{ID: t.id, Node: q.node, Limits: cfg.limits(), Cost: t.cost, Tokens: t.tokens, Asks: t.asks}
	backoff := 10 * time.Millisecond
	for {
		actx, cancel := context.WithDeadline(ctx, deadline)
		sent := time.Now()
		err = q.beforeLeave(func() error {
			var err error
			res, err = q.store.Acquire(actx, args)
			return err
		})
		cancel()
		if err == nil || errors.Is(err, errClosed) {
			return res, answeredInLease(sent, args.Lease), args.Permits, err
		}
		if ctx.Err() != nil || !time.Now().Before(callDeadline(ctx, deadline)) {
			return res, false, 0, err // the caller's deadline, not the store's fault
		}
		q.health.record(q.log, err)
		if !q.health.up() || time.Until(deadline) <= backoff {
			return res, false, 0, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return res, false, 0, err
		}
		backoff = min(2*backoff, 200*time.Millisecond)
		// Sent again under the settings in force now: a reload while the
		// call failed may allow fewer permits, which the store would
		// otherwise dispatch above (the ticket is the same: the scripts
		// are idempotent by it).
		args.Limits = q.cfg.Load().limits()
	}
}

// callDeadline is the earlier of ctx's deadline and d.
func callDeadline(ctx context.Context, d time.Time) time.Time {
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

// asks is TicketArgs.Asks for a request of n tokens weighing w: n where
// w counts (the config counts tokens) and is n clamped, else 0.
func asks(n, w int) int {
	if w > 0 && n > w {
		return n
	}
	return 0
}
