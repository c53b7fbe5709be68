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
// cluster client routes to the slot's new owner. A failover, on Redis
// 7.0, unsubscribes nobody: the old master's subscribers stay there, on
// a replica now, which passes the new master's messages on only while
// it replicates that master (not once it replicates another). So a
// sharded Subscription on a cluster also checks, at each ping tick, that
// its client still routes the slot to the master it subscribed on, and
// subscribes again when it does not.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// pingAfter is how long a subscription may stay silent before it
	// pings Redis: a connection that broke meanwhile fails the ping, and
	// go-redis reconnects and subscribes again.
	pingAfter = 2 * time.Second
	// retryReceiveAfter spaces the reads of a connection that keeps
	// failing (Redis down: each read dials first).
	retryReceiveAfter = 100 * time.Millisecond
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
	owner  string        // the slot's master when ps subscribed; "": unknown
	closed bool
}

// slotRouter is a cluster client: it names the master of a key's slot.
type slotRouter interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// slotOwner returns the address of the master the client routes the
// channel's slot to: "" unless the subscription is sharded on a cluster,
// or where the client cannot tell.
func (s *Subscription) slotOwner(ctx context.Context) string {
	r, ok := s.rdb.(slotRouter)
	if !s.sharded || !ok {
		return ""
	}
	c, err := r.MasterForKey(ctx, s.channel)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// moved reports whether the client now routes the channel's slot to
// another master than the one the subscription was made on.
func (s *Subscription) moved() bool {
	s.mu.Lock()
	owner := s.owner
	s.mu.Unlock()
	if owner == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(s.ctx, confirmTimeout) // a first slot map may be loaded
	defer cancel()
	now := s.slotOwner(ctx)
	return now != "" && now != owner
}

// Subscribe subscribes to channel (SSUBSCRIBE when sharded, SUBSCRIBE
// otherwise) and returns once Redis confirmed it, so that every message
// published afterwards is delivered (unless the connection drops). It
// retries until ctx ends. It keeps the subscription alive in the
// background until Close: go-redis reconnects, and the Subscription
// subscribes again when the server unsubscribes it.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, channel string, sharded bool, h Listener) (*Subscription, error) {
	s := &Subscription{rdb: rdb, channel: channel, sharded: sharded, h: h, done: make(chan struct{})}
	ps, err := s.subscribe(ctx)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", channel, err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run(ps)
	return s, nil
}

// run delivers messages until Close, subscribing again each time the
// server unsubscribes the channel.
func (s *Subscription) run(ps *redis.PubSub) {
	defer close(s.done)
	for s.deliver(ps) {
		s.drop(ps)
		var err error
		if ps, err = s.subscribe(s.ctx); err != nil {
			return // closed
		}
		if s.h.Subscribed != nil {
			s.h.Subscribed()
		}
	}
}

// deliver reads ps's messages and hands them to the Listener until the
// server unsubscribes the channel (true) or ps is closed (false). It
// reads the connection itself rather than through go-redis's channel,
// whose reader and health-check goroutines would each be woken for every
// message before this one: a grant's waiter starts two wake-ups sooner.
// It does what they did: a read that fails has made go-redis reconnect
// and subscribe again (the confirmation comes as a message), and a
// subscription silent for pingAfter is pinged (ping), so that a broken
// connection is found and replaced.
func (s *Subscription) deliver(ps *redis.PubSub) (unsubscribed bool) {
	var heard atomic.Int64 // unix ns of the last message
	heard.Store(time.Now().UnixNano())
	var stale atomic.Bool // set by ping, which closed ps: its pong never came
	stop := make(chan struct{})
	pinged := make(chan struct{})
	go s.ping(ps, &heard, &stale, stop, pinged)
	defer func() {
		close(stop)
		<-pinged
	}()
	failed := false
	for {
		m, err := ps.Receive(s.ctx)
		if err != nil {
			if s.isClosed() {
				return false
			}
			if stale.Load() {
				return true // a half-open connection: subscribe on a new one
			}
			if errors.Is(err, redis.ErrClosed) {
				return false
			}
			if failed && !s.sleep(retryReceiveAfter) {
				return false
			}
			failed = true
			continue
		}
		failed = false
		heard.Store(time.Now().UnixNano())
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
}

// ping pings ps whenever it has heard nothing for pingAfter, until stop
// is closed; then it closes done. At each tick it first checks that the
// client still routes the channel's slot to the master ps subscribed on:
// if not (a failover, of which Redis 7.0 tells the subscribers nothing)
// it marks ps stale and closes it, and deliver subscribes again. A ping
// that cannot be sent makes go-redis reconnect, which ends the read in
// progress with an error. A ping sent whose pong (or anything else) does
// not come within confirmTimeout went out on a half-open connection,
// which the read, without a deadline, would wait on for as long as the
// kernel keeps it: ping marks it stale and closes ps, and deliver
// subscribes again.
func (s *Subscription) ping(ps *redis.PubSub, heard *atomic.Int64, stale *atomic.Bool, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(pingAfter / 2)
	defer t.Stop()
	var sent int64 // unix ns of the ping not answered yet; 0: none
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if s.moved() {
			stale.Store(true)
			_ = ps.Close()
			return
		}
		last := heard.Load()
		if sent != 0 {
			if last >= sent {
				sent = 0 // answered (or the reconnect's confirmation came)
			} else {
				if time.Since(time.Unix(0, sent)) >= confirmTimeout {
					stale.Store(true)
					_ = ps.Close()
					return
				}
				continue
			}
		}
		if time.Since(time.Unix(0, last)) < pingAfter {
			continue
		}
		sent = time.Now().UnixNano()
		ctx, cancel := context.WithTimeout(s.ctx, confirmTimeout)
		_ = ps.Ping(ctx)
		cancel()
	}
}

// sleep waits d, or until Close; it reports whether the subscription is
// still open.
func (s *Subscription) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// subscribe opens a PubSub on the channel and waits for Redis to
// confirm it, retrying with backoff until it succeeds or ctx ends.
func (s *Subscription) subscribe(ctx context.Context) (*redis.PubSub, error) {
	backoff := minBackoff
	t := time.NewTimer(backoff)
	defer t.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ps, err := s.attempt(ctx)
		if err == nil {
			return ps, nil
		}
		if errors.Is(err, errClosed) {
			return nil, err
		}
		// A stale slot map sends the attempt to the slot's old owner,
		// which answers MOVED.
		if c, ok := s.rdb.(interface{ ReloadState(context.Context) }); ok {
			c.ReloadState(ctx)
		}
		t.Reset(backoff)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// attempt subscribes once and reads the confirmation (or the error:
// MOVED from a slot's old owner).
func (s *Subscription) attempt(ctx context.Context) (*redis.PubSub, error) {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	owner := s.slotOwner(ctx) // the master the client sends it to
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
		return nil, errClosed
	}
	s.ps, s.owner = ps, owner // ps: so that Close interrupts the wait
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
			return nil, errClosed
		}
		return nil, err
	}
	return ps, nil
}

// drop closes ps, which ends a read in progress.
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
