package fairqueue

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// rejoin tries to open the store again once per retryOpenAfter, from
// the first failed open until one succeeds or the node leaves: with no
// loop yet (the node never joined), nothing else would notice, with no
// request, that the store answers again, and the store would read down
// (health; store_up) until the next request. Joined, the loop probes.
func (s *session) rejoin() {
	defer close(s.retryDone)
	t := time.NewTicker(retryOpenAfter)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if err := s.open(context.Background(), true); err == nil || errors.Is(err, errClosed) {
			return
		}
	}
}

// joinWait is the longest a request waits for an open on its way after
// one failed (join): long enough for an open to a store that answers
// again, short against one to a store that hangs (up to StoreTimeout).
const joinWait = 50 * time.Millisecond

// join opens the store (subscribing this node to its grants) before the
// node's first acquire, so no grant can slip between the two, and starts
// the loop.
func (s *session) join(ctx context.Context) error {
	// After a failed open the store reads down: a request that comes
	// while the next open is on its way (rejoin's, in the background, or
	// another request's) waits for it at most joinWait, then is answered
	// by the store-error policy with the failed open's error, rather than
	// after that open, which takes up to the store's timeout where Redis
	// hangs. An open that succeeds meanwhile serves it.
	if ch := s.joining.Load(); ch != nil {
		t := time.NewTimer(joinWait)
		select {
		case <-*ch:
		case <-t.C:
			if err := s.failedErr.Load(); err != nil {
				return *err
			}
		}
		t.Stop()
	}
	return s.open(ctx, false)
}

// open is join's open; paced (rejoin's, once per retryOpenAfter) it
// does not wait out retryOpenAfter after the last failed one.
func (s *session) open(ctx context.Context, paced bool) error {
	q := s.q
	s.openMu.Lock()
	defer s.openMu.Unlock()
	if s.opened {
		return nil
	}
	if q.closed.Load() {
		return errClosed
	}
	if !paced && !s.openFailedAt.IsZero() && time.Since(s.openFailedAt) < retryOpenAfter {
		return s.openErr
	}
	cfg := q.cfg.Load()
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.StoreTimeout)
	defer cancel()
	s.confirmed.Store(&confirmation{sent: time.Since(s.base)}) // before the first grant can come
	if s.failedErr.Load() != nil {
		ch := make(chan struct{})
		s.joining.Store(&ch)
		defer func() { s.joining.Store(nil); close(ch) }()
	}
	if err := q.store.Open(octx, q.node, q); err != nil {
		s.openFailedAt, s.openErr = time.Now(), err
		s.failedErr.Store(&err)
		q.health.failed(q.log, err)
		// Every request until the next try (retryOpenAfter) is answered
		// by the store-error policy without a call: the store is down for
		// them, and reads so from the first, also where the open ran out
		// of time (a dial that hangs, a frozen store) rather than being
		// refused.
		q.health.markDown(q.log, err)
		if !s.retrying {
			s.retrying, s.retryDone = true, make(chan struct{})
			go s.rejoin()
		}
		return err
	}
	s.opened = true
	s.failedErr.Store(nil)
	q.health.ok(q.log) // the store answered: a down mark from failed opens ends
	q.log.Info("node joined queue", zap.Int("permits", cfg.Permits))
	go s.loop()
	return nil
}

// end stops the loop, if the node joined, and rejoin, if an open failed,
// and reports whether the node had joined. Queue.leave calls it once,
// closed set: no join succeeds after it read opened.
func (s *session) end() (joined bool) {
	s.openMu.Lock()
	joined, retrying := s.opened, s.retrying
	s.openMu.Unlock()
	if joined || retrying {
		close(s.stop)
	}
	if joined {
		<-s.done
	}
	if retrying {
		<-s.retryDone
	}
	return joined
}
