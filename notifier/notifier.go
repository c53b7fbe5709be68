// Package notifier delivers one node's wake-up messages over Redis
// Pub/Sub: one subscription per node, on a channel only that node reads,
// so a grant wakes exactly the waiter it is for. Pub/Sub is at most once
// (a message published while the connection is re-established is lost),
// so every (re)subscription is reported: the caller then reconciles.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Handler receives a subscription's events. Both must return quickly.
type Handler struct {
	// Message is called with the payload of each message, in order.
	Message func(payload string)
	// Subscribed is called after every subscription confirmation but
	// the first (the first is awaited by Subscribe itself).
	Subscribed func()
}

// Subscription is a live subscription to one channel.
type Subscription struct {
	ps   *redis.PubSub
	done chan struct{}
	once sync.Once
}

// Subscribe subscribes to channel (SSUBSCRIBE when sharded, SUBSCRIBE
// otherwise) and returns once Redis confirmed it, so that every message
// published afterwards is delivered (unless the connection drops). It
// keeps reconnecting in the background until Close.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, channel string, sharded bool, h Handler) (*Subscription, error) {
	var ps *redis.PubSub
	if sharded {
		ps = rdb.SSubscribe(ctx, channel)
	} else {
		ps = rdb.Subscribe(ctx, channel)
	}
	ch := ps.ChannelWithSubscriptions(
		redis.WithChannelSize(4096),
		redis.WithChannelHealthCheckInterval(2*time.Second),
	)
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, errors.New("subscription closed")
		}
		if _, isSub := m.(*redis.Subscription); !isSub {
			_ = ps.Close()
			return nil, fmt.Errorf("subscribe %s: unexpected first message %T", channel, m)
		}
	case <-ctx.Done():
		_ = ps.Close()
		return nil, fmt.Errorf("subscribe %s: %w", channel, ctx.Err())
	}
	s := &Subscription{ps: ps, done: make(chan struct{})}
	go s.run(ch, h)
	return s, nil
}

func (s *Subscription) run(ch <-chan any, h Handler) {
	defer close(s.done)
	for m := range ch {
		switch m := m.(type) {
		case *redis.Message:
			if h.Message != nil {
				h.Message(m.Payload)
			}
		case *redis.Subscription:
			if h.Subscribed != nil && (m.Kind == "subscribe" || m.Kind == "ssubscribe") {
				h.Subscribed()
			}
		}
	}
}

// Close ends the subscription and waits for its goroutine to stop.
func (s *Subscription) Close() error {
	var err error
	s.once.Do(func() {
		err = s.ps.Close()
		<-s.done
	})
	return err
}
