// Package notifier delivers one node's wake-up messages over Redis
// Pub/Sub: one subscription per node, on a channel only that node reads,
// so a grant wakes exactly the waiter it is for. Pub/Sub is at most once
// (a message published while the connection is re-established is lost),
// so every (re)subscription is reported: the caller then reconciles.
//
// go-redis resubscribes after a reconnect, but not when the server
// itself unsubscribes the client: Redis Cluster does that to the
// subscribers of a shard channel whose slot the node lost (a slot
// migration, a failover). The connection then stays open, subscribed to
// nothing, and re-subscribing on it only earns MOVED from the old owner.
// So the Subscription drops that PubSub and opens a new one, which the
// cluster client routes to the slot's new owner.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// confirmTimeout bounds the wait for Redis to confirm one
	// subscription attempt.
	confirmTimeout = 5 * time.Second
	// minBackoff and maxBackoff bound the pause between attempts: short
	// at first, since a moved slot is usually served again at once.
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
)

// errClosed ends an attempt that Close overtook.
var errClosed = errors.New("subscription closed")

// Listener receives a subscription's events. Both must return quickly.
type Listener struct {
	// Message is called with the payload of each message, in order.
	Message func(payload string)
	// Subscribed is called after every subscription confirmation but
	// the first (the first is awaited by Subscribe itself): after
	// go-redis reconnected, and after the Subscription subscribed again
	// because the server had unsubscribed it.
	Subscribed func()
}

// Subscription is a live subscription to one channel.
type Subscription struct {
	rdb     redis.UniversalClient
	channel string
	sharded bool
	h       Listener

	ctx    context.Context // cancelled by Close: ends a resubscription
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	once   sync.Once

	mu     sync.Mutex
	ps     *redis.PubSub // the current one, closed by Close
	closed bool
}

// Subscribe subscribes to channel (SSUBSCRIBE when sharded, SUBSCRIBE
// otherwise) and returns once Redis confirmed it, so that every message
// published afterwards is delivered (unless the connection drops). It
// retries until ctx ends. It keeps the subscription alive in the
// background until Close: go-redis reconnects, and the Subscription
// subscribes again when the server unsubscribes it.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, channel string, sharded bool, h Listener) (*Subscription, error) {
	s := &Subscription{rdb: rdb, channel: channel, sharded: sharded, h: h, done: make(chan struct{})}
	ps, ch, err := s.subscribe(ctx)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", channel, err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run(ps, ch)
	return s, nil
}

// run delivers messages until Close, subscribing again each time the
// server unsubscribes the channel.
func (s *Subscription) run(ps *redis.PubSub, ch <-chan any) {
	defer close(s.done)
	for s.deliver(ch) {
		// Drop the PubSub and wait for go-redis's receiving goroutine
		// to end: it closes ch.
		s.drop(ps)
		for range ch {
		}
		var err error
		if ps, ch, err = s.subscribe(s.ctx); err != nil {
			return // closed
		}
		if s.h.Subscribed != nil {
			s.h.Subscribed()
		}
	}
}

// deliver hands ch's messages to the Listener until the server
// unsubscribes the channel (true) or ch is closed (false).
func (s *Subscription) deliver(ch <-chan any) (unsubscribed bool) {
	for m := range ch {
		switch m := m.(type) {
		case *redis.Message:
			if s.h.Message != nil {
				s.h.Message(m.Payload)
			}
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				if s.h.Subscribed != nil {
					s.h.Subscribed()
				}
			case "unsubscribe", "sunsubscribe":
				// Never asked for: we close instead of unsubscribing.
				if m.Channel == s.channel {
					return true
				}
			}
		}
	}
	return false
}

// subscribe opens a PubSub on the channel and waits for Redis to
// confirm it, retrying with backoff until it succeeds or ctx ends.
func (s *Subscription) subscribe(ctx context.Context) (*redis.PubSub, <-chan any, error) {
	backoff := minBackoff
	t := time.NewTimer(backoff)
	defer t.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		ps, ch, err := s.attempt(ctx)
		if err == nil {
			return ps, ch, nil
		}
		if errors.Is(err, errClosed) {
			return nil, nil, err
		}
		// A stale slot map sends the attempt to the slot's old owner,
		// which answers MOVED.
		if c, ok := s.rdb.(interface{ ReloadState(context.Context) }); ok {
			c.ReloadState(ctx)
		}
		t.Reset(backoff)
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w (last attempt: %v)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// attempt subscribes once. The confirmation is read before the channel
// is made, as go-redis's channel drops errors (MOVED among them).
func (s *Subscription) attempt(ctx context.Context) (*redis.PubSub, <-chan any, error) {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	var ps *redis.PubSub
	if s.sharded {
		ps = s.rdb.SSubscribe(ctx, s.channel)
	} else {
		ps = s.rdb.Subscribe(ctx, s.channel)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ps.Close()
		return nil, nil, errClosed
	}
	s.ps = ps // so that Close interrupts the wait
	s.mu.Unlock()
	m, err := ps.Receive(ctx)
	if err == nil {
		if sub, ok := m.(*redis.Subscription); !ok || (sub.Kind != "subscribe" && sub.Kind != "ssubscribe") {
			err = fmt.Errorf("unexpected first message %v", m)
		}
	}
	if err != nil {
		s.drop(ps)
		if s.isClosed() {
			return nil, nil, errClosed
		}
		return nil, nil, err
	}
	ch := ps.ChannelWithSubscriptions(
		redis.WithChannelSize(4096),
		redis.WithChannelHealthCheckInterval(2*time.Second),
	)
	return ps, ch, nil
}

// drop closes ps, which ends its channel.
func (s *Subscription) drop(ps *redis.PubSub) {
	s.mu.Lock()
	if s.ps == ps {
		s.ps = nil
	}
	s.mu.Unlock()
	_ = ps.Close()
}

func (s *Subscription) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close ends the subscription and waits for its goroutine to stop.
func (s *Subscription) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		ps := s.ps
		s.ps = nil
		s.mu.Unlock()
		s.cancel()
		// ErrClosed: the attempt in flight had lost its connection.
		if ps != nil {
			if err = ps.Close(); errors.Is(err, redis.ErrClosed) {
				err = nil
			}
		}
		<-s.done
	})
	return err
}
