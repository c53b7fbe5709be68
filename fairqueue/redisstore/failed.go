package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// failed is busy, and notes a call Redis gave no answer to (a timeout,
// a broken connection, a context ended): Redis may run it still, after
// the node's leave (Leave).
func (s *Store) failed(err error) error {
	if unanswered(err) {
		s.unsure.Store(time.Now().UnixMilli())
	}
	return busy(err)
}

// unanswered reports whether err says Redis gave a call no answer (not
// an error reply, not a call that found no connection): Redis may run it
// still, late.
func unanswered(err error) bool {
	var reply redis.Error
	return err != nil && !errors.As(err, &reply) && !errors.Is(err, redis.ErrPoolTimeout)
}

// mayBeLate reports whether a call of the store may still reach Redis:
// one got no answer within a tombstone's life, and no answer since
// settled it (a register's never does: see lostRegister).
func (s *Store) mayBeLate() bool {
	for _, u := range []int64{s.unsure.Load(), s.lostRegister.Load()} {
		if u != 0 && time.Since(time.UnixMilli(u)) < TombstoneTTL {
			return true
		}
	}
	return false
}

// settled notes that Redis answered a call sent when unsure read u:
// Redis answers what reached it in turn, so the calls that failed before
// that one was sent no longer wait in it; a later failure stays noted.
func (s *Store) settled(u int64) {
	if u != 0 {
		s.unsure.CompareAndSwap(u, 0)
	}
}

// busy marks an error that says this process has no free connection:
// the client is overloaded, Redis is not (necessarily) down.
func busy(err error) error {
	if errors.Is(err, redis.ErrPoolTimeout) {
		return fmt.Errorf("%w: %w", fairqueue.ErrStoreBusy, err)
	}
	return err
}
