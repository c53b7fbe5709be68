package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The last connected instance leaves (every key deleted) while another
// is cut off from Redis running requests it admitted by its policy
// (fail_open, local): healed, that instance counts them in the new data
// set, so a newcomer gets no more than the permits they leave.
func TestRequestsAdmittedDuringAnOutageCountAfterTheLastConnectedInstanceLeft(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  fairqueue.Config
	}{
		{"fail_open", fairqueue.Config{FailOpen: true}},
		{"local", fairqueue.Config{Fallback: memstore.New(), LocalPermits: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			const name = "lastleave"
			cfg := tc.cfg
			cfg.Permits, cfg.Lease, cfg.PollInterval, cfg.MaxWait = 2, time.Second, 50*time.Millisecond, 10*time.Second
			a, b, px := cutOffPair(t, srv, name, cfg, fairqueue.Request{}, fairqueue.Request{})
			px.Cut()
			var held []*fairqueue.Permit
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				p, err := a.q.Acquire(ctx, fairqueue.Request{})
				cancel()
				if tc.cfg.Fallback != nil && len(held) == 1 {
					require.Error(t, err, "one local permit")
					break
				}
				require.NoError(t, err)
				require.True(t, p.FailOpen() || p.Local(), "admitted by the policy")
				held = append(held, p)
			}
			// b forgets a (silent past its lease), then leaves: the last
			// live node, it deletes every key.
			time.Sleep(2 * cfg.Lease)
			require.NoError(t, b.q.Close())
			require.Empty(t, srv.Keys(t, "*"), "the last live node left nothing")
			px.Heal()
			eventually(t, 10*time.Second, func() bool { return a.q.Stats().StoreUp }, "a never saw the store back")
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, srv.Client(t), name).Holders) == len(held)
			}, "a's running requests never counted in the new data set: holders %v", readState(t, srv.Client(t), name).Holders)

			cn := newNode(t, srv, name, cfg)
			granted := 0
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
				p, err := cn.q.Acquire(ctx, fairqueue.Request{})
				cancel()
				if err == nil {
					granted++
					defer p.Release()
				}
			}
			assert.Equal(t, cfg.Permits-len(held), granted, "a newcomer got more than the permits a's running requests left")
			for _, p := range held {
				p.Release()
			}
		})
	}
}

// The waiters an instance cut off from Redis had queued there are served
// once it is back, though the last connected instance left meanwhile and
// deleted every key (its waiters with them). With on_store_error local
// they move into the fallback queue once the instance marks Redis down,
// and are served there or, once it retires, by the shared queue.
func TestWaitersOfACutOffInstanceServedAfterTheLastConnectedInstanceLeft(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  fairqueue.Config
	}{
		{"fail_closed", fairqueue.Config{}},
		{"fail_open", fairqueue.Config{FailOpen: true}},
		{"local", fairqueue.Config{Fallback: memstore.New(), LocalPermits: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			const name = "lastleavew"
			cfg := tc.cfg
			cfg.Permits, cfg.Lease, cfg.PollInterval, cfg.MaxWait = 2, time.Second, 50*time.Millisecond, 15*time.Second
			a, b, px := cutOffPair(t, srv, name, cfg, fairqueue.Request{})
			var bp []*fairqueue.Permit
			for range 2 {
				p, err := b.q.Acquire(context.Background(), fairqueue.Request{})
				require.NoError(t, err)
				bp = append(bp, p)
			}
			w1 := acquireAsync(a, context.Background())
			eventually(t, 5*time.Second, func() bool { return len(readState(t, b.rdb, name).Waiting) == 1 }, "w1 not queued")
			w2 := acquireAsync(a, context.Background())
			eventually(t, 5*time.Second, func() bool { return len(readState(t, b.rdb, name).Waiting) == 2 }, "w2 not queued")
			px.Cut()
			time.Sleep(2 * cfg.Lease)
			for _, p := range bp {
				p.Release()
			}
			require.NoError(t, b.q.Close())
			require.Empty(t, srv.Keys(t, "*"), "the last live node left nothing")
			px.Heal()
			for i, w := range []<-chan acquired{w1, w2} {
				select {
				case r := <-w:
					if assert.NoError(t, r.err, "waiter %d", i) {
						if tc.cfg.Fallback == nil {
							assert.False(t, r.p.FailOpen() || r.p.Local(), "waiter %d served by the shared queue", i)
						}
						r.p.Release()
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("waiter %d never answered", i)
				}
			}
		})
	}
}
