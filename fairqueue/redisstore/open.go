package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/notifier"
)

// Open implements fairqueue.Store: it subscribes node to its grant
// channel and waits for Redis to confirm the subscription. A Store serves
// one node: Open for another node before Close is an error (the grants a
// call returns go to one Listener).
func (s *Store) Open(ctx context.Context, node string, h fairqueue.Listener) (err error) {
	s.mu.Lock()
	if s.node != "" && s.node != node {
		other := s.node
		s.mu.Unlock()
		return fmt.Errorf("open %s: already open for node %s: one Store per Queue", s.tag, other)
	}
	s.node = node
	s.mu.Unlock()
	defer func() {
		if err != nil {
			s.mu.Lock()
			if s.sub == nil {
				s.node = ""
			}
			s.mu.Unlock()
		}
	}()
	sharded, err := s.detectSharded(ctx)
	if err != nil {
		return fmt.Errorf("open %s: %w", s.tag, err)
	}
	pub := "publish"
	if sharded {
		pub = "spublish"
	}
	s.pub.Store(&pub)
	sub, err := notifier.Subscribe(ctx, s.rdb, s.chPrefix+node, sharded, notifier.Listener{
		Message: func(payload string) {
			if g, ok := parseGrant(payload); ok {
				h.Granted(g)
			}
		},
		Subscribed: h.Resynced,
	})
	if err != nil {
		return fmt.Errorf("open %s: %w", s.tag, err)
	}
	s.mu.Lock()
	s.sub, s.h, s.closed = sub, h, false
	s.mu.Unlock()
	s.leftAt.Store(0)
	s.register(ctx, true)
	return nil
}

// Close implements fairqueue.Store: it ends the subscription. The Redis
// client is the caller's.
func (s *Store) Close() error {
	s.stopSweep()
	s.mu.Lock()
	sub := s.sub
	s.sub, s.node = nil, ""
	s.mu.Unlock()
	if sub != nil {
		return sub.Close()
	}
	return nil
}

// info reads Redis' server section, bounded by ctx (see bounded).
func (s *Store) info(ctx context.Context) (string, error) {
	if !s.bound {
		return s.rdb.Info(ctx, "server").Result()
	}
	return within(ctx, func() *redis.StringCmd { return s.rdb.Info(ctx, "server") }, func(ctx context.Context) *redis.StringCmd {
		cmd := redis.NewStringCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}).Result()
}

// do runs a command that is not a script, bounded by ctx (see bounded).
func (s *Store) do(ctx context.Context, args ...any) *redis.Cmd {
	if !s.bound {
		return s.rdb.Do(ctx, args...)
	}
	return within(ctx, func() *redis.Cmd { return s.rdb.Do(ctx, args...) }, cutCmd)
}
