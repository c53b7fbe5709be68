package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// fairCounts reads what Redis counts for the permits held: the fair
// in-flight counts (finf), the tokens held (tsum) and their holders
// (thold).
func fairCounts(t *testing.T, n *node, name string) (finf map[string]string, tsum string, thold map[string]string) {
	t.Helper()
	ctx := context.Background()
	tag := redisstore.New(n.rdb, name, redisstore.Options{}).Tag()
	finf, err := n.rdb.HGetAll(ctx, tag+":finf").Result()
	require.NoError(t, err)
	thold, err = n.rdb.HGetAll(ctx, tag+":thold").Result()
	require.NoError(t, err)
	tsum, _ = n.rdb.Get(ctx, tag+":tsum").Result()
	return finf, tsum, thold
}

// Requests admitted by on_store_error (allow, local) whose clients leave
// during the outage, or wait in the fallback queue and leave, are not
// counted once Redis is back; those still running are, for their tenant
// and with their tokens; once they end every permit and token is free
// again (another instance gets all of them at once) and the last leave
// leaves no key.
func TestOutageRequestsWhoseClientsLeftAreNotCountedAfterTheAdoption(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  fairqueue.Config
	}{
		{"allow", fairqueue.Config{FailOpen: true}},
		{"local", fairqueue.Config{Fallback: memstore.New(), LocalPermits: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			name := "outageleft" + tc.name
			cfg := tc.cfg
			cfg.Permits, cfg.KVTokens, cfg.Fair, cfg.MaxInFlightPerTenant = 2, 100, true, 2
			cfg.Lease, cfg.PollInterval, cfg.MaxWait = 30*time.Second, 50*time.Millisecond, 5*time.Second
			warm := fairqueue.Request{Tenant: "warmup"}
			a, b, px := cutOffPair(t, srv, name, cfg, warm, warm)

			px.Cut()
			ctx := context.Background()
			stays, err := a.q.Acquire(ctx, fairqueue.Request{Tenant: "x", Tokens: 40})
			require.NoError(t, err)
			require.True(t, stays.FailOpen() || stays.Local(), "admitted by the policy")
			leaves, err := a.q.Acquire(ctx, fairqueue.Request{Tenant: "x", Tokens: 40})
			require.NoError(t, err)
			if tc.cfg.Fallback != nil {
				// A third waits in the full fallback queue; its client leaves.
				wctx, cancel := context.WithCancel(ctx)
				queued := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					p, err := a.q.Acquire(wctx, fairqueue.Request{Tenant: "y", Tokens: 10,
						OnQueued: func(fairqueue.Waiting) { close(queued) }})
					if p != nil {
						p.Release()
					}
					done <- err
				}()
				select {
				case <-queued:
				case <-time.After(10 * time.Second):
					t.Fatal("the third request never queued in the fallback queue")
				}
				cancel()
				require.Error(t, <-done, "the waiter whose client left")
			}
			leaves.Release() // its client left during the outage

			px.Heal()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 1
			}, "the running request was never counted in Redis")
			st := readState(t, b.rdb, name)
			assert.Equal(t, []string{stays.Ticket()}, st.Holders, "only the request still running is counted")
			assert.Empty(t, st.Waiting)
			finf, tsum, _ := fairCounts(t, b, name)
			assert.Equal(t, "1", finf[fairqueue.TenantKey("x")], "tenant x runs one request: %v", finf)
			assert.Equal(t, "40", tsum, "the running request's tokens")

			stays.Release()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 0
			}, "the adopted permit was never given back")
			finf, tsum, thold := fairCounts(t, b, name)
			assert.Empty(t, finf, "tenants' in-flight counts once every request ended")
			assert.Empty(t, thold, "tokens held once every request ended")
			assert.Contains(t, []string{"", "0"}, tsum, "tokens held once every request ended")

			// Every permit and token is free: tenant x runs 2 requests of
			// 50 tokens at once on the other instance.
			takeAtOnce(t, b, "a permit or token left held after the outage",
				fairqueue.Request{Tenant: "x", Tokens: 50}, fairqueue.Request{Tenant: "x", Tokens: 50})
			require.NoError(t, a.q.Close())
			require.NoError(t, b.q.Close())
			assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance left")
		})
	}
}

// A fail-open permit released while the heartbeat that adopts it is on
// its way: the heartbeat counts it in Redis, and the node gives it back
// at once, for its tenant and its tokens too; nothing waits for its lease.
func TestFailOpenPermitReleasedWhileItsAdoptionIsOnItsWayIsGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	const name = "adoptleft"
	h := &heldAdoption{entered: make(chan struct{}), open: make(chan struct{})}
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(h.open) }) }
	cfg := fairqueue.Config{Permits: 1, KVTokens: 100, Fair: true, MaxInFlightPerTenant: 1, FailOpen: true,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 5 * time.Second}
	n := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { h.Store = s; return h })
	h.up = func() bool { return n.q.Stats().StoreUp }
	t.Cleanup(openGate)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{Tenant: "x"})
	require.NoError(t, err)
	p.Release()

	srv.Kill()
	p, err = n.q.Acquire(context.Background(), fairqueue.Request{Tenant: "x", Tokens: 60})
	require.NoError(t, err)
	require.True(t, p.FailOpen())
	h.armed.Store(true)
	srv.Restart()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat adopted the fail-open permit")
	}
	p.Release() // the client leaves while the adoption is on its way
	openGate()

	other := newNode(t, srv, name, cfg)
	q, err := other.q.Acquire(context.Background(), fairqueue.Request{Tenant: "x", Tokens: 100})
	require.NoError(t, err, "the permit released during its adoption still held in Redis")
	q.Release()
	finf, _, thold := fairCounts(t, other, name)
	assert.Empty(t, finf)
	assert.Empty(t, thold)
}
