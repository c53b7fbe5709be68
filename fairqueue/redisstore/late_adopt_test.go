package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/faultproxy"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// lateAdoption keeps, once armed, the first heartbeat that adopts
// fail-open permits and answers it, and every later one, as a client
// that gave up on the call does (a timeout): the test sends the kept
// one to Redis later, as Redis would run it late.
type lateAdoption struct {
	fairqueue.Store
	armed atomic.Bool
	once  sync.Once
	kept  chan fairqueue.HeartbeatArgs
}

func (s *lateAdoption) Heartbeat(ctx context.Context, args fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if !s.armed.Load() || len(args.Adopt) == 0 {
		return s.Store.Heartbeat(ctx, args)
	}
	s.once.Do(func() { s.kept <- args })
	return fairqueue.HeartbeatResult{}, context.DeadlineExceeded
}

// An instance cut off from Redis admits a request by fail_open; healed,
// its heartbeat that adopts that permit times out on its side, and it
// leaves (Close) while the request runs. Redis runs that heartbeat only
// after the leave: it adopts nothing. The other instance gets every
// permit at once, and its leave, the last, leaves nothing in Redis.
func TestHeartbeatAdoptingAfterTheLeaveCountsNothing(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lateadopt"
	cfg := fairqueue.Config{Name: name, Permits: 2, FailOpen: true, Lease: 20 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}

	px := faultproxy.Start(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), DialTimeout: redisstore.DefaultDialTimeout,
		ReadTimeout: redisstore.DefaultReadTimeout, WriteTimeout: redisstore.DefaultWriteTimeout,
		MaxRetries: redisstore.DefaultMaxRetries, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	late := &lateAdoption{Store: redisstore.New(rdb, name, redisstore.Options{}), kept: make(chan fairqueue.HeartbeatArgs, 1)}
	a, err := fairqueue.New(late, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b := newNode(t, srv, name, cfg)
	for _, q := range []*fairqueue.Queue{a, b.q} {
		p, err := q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}

	px.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	p, err := a.Acquire(ctx, fairqueue.Request{})
	cancel()
	require.NoError(t, err)
	require.True(t, p.FailOpen(), "admitted by fail_open")
	defer p.Release()
	late.armed.Store(true)
	px.Heal()
	var beat fairqueue.HeartbeatArgs
	select {
	case beat = <-late.kept:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat adopted the fail-open permit")
	}
	require.Equal(t, []string{p.Ticket()}, beat.Adopt)

	require.NoError(t, a.Close())
	require.NotContains(t, readState(t, srv.Client(t), name).Nodes, a.Node(), "a left")
	// Redis runs the heartbeat now, after a's leave.
	_, err = late.Store.Heartbeat(context.Background(), beat)
	require.NoError(t, err)

	st := readState(t, srv.Client(t), name)
	assert.NotContains(t, st.Holders, p.Ticket(), "a heartbeat run after its node's leave adopted a permit for nobody")
	assert.NotContains(t, st.Nodes, a.Node(), "a heartbeat run after its node's leave brought it back to life")
	var held []*fairqueue.Permit
	for range cfg.Permits {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		q, err := b.q.Acquire(ctx, fairqueue.Request{})
		cancel()
		if err == nil {
			held = append(held, q)
		}
	}
	assert.Len(t, held, cfg.Permits, "b got fewer than the permits: Redis counts a's adopted permit for nobody")
	for _, q := range held {
		q.Release()
	}
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance left")
}
