package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

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
	s.register(ctx, true)
	return nil
}

func (s *Store) detectSharded(ctx context.Context) (bool, error) {
	if s.sharded != nil {
		return *s.sharded, nil
	}
	info, err := s.info(ctx)
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
			return major >= 7, nil
		}
	}
	return false, nil
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
