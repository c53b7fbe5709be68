package caddyfairqueue

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestReloadHandsTheQueueToTheNewHandlerWithItsSettings(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	old := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(old, next)
	next.waitEntered(t)

	// Reload: the new config is provisioned, then the old one cleaned up
	// while its request still runs.
	updated := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 2})
	require.Same(t, engineOf(t, old), engineOf(t, updated), "one engine across the reload")
	e := engineOf(t, old)
	assert.Equal(t, 1, e.q.Config().Permits, "provisioning changes nothing live")
	require.NoError(t, old.Cleanup())

	b := newRequest(context.Background(), ``).start(updated, next)
	next.waitEntered(t)
	assert.Equal(t, "0", b.placeholder(phPosition), "with the new permits b runs beside a at once")
	assert.Equal(t, 2, e.q.Config().Permits)

	next.release <- struct{}{}
	next.release <- struct{}{}
	a.wait(t)
	b.wait(t)
	assert.False(t, e.closed, "the new handler still uses the engine")
}

func TestRetiredQueueClosesAfterItsLastRequest(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "retired", Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	e := engineOf(t, h)

	require.NoError(t, h.Cleanup()) // a reload that drops this queue
	e.mu.Lock()
	closedEarly := e.closed
	e.mu.Unlock()
	assert.False(t, closedEarly, "the engine outlives its handler while a request runs")

	next.release <- struct{}{}
	a.wait(t)
	assert.Equal(t, http.StatusOK, a.w.Code)
	// The permit's release, and so the request's exit, runs after the
	// answer (engine.finish).
	assert.Eventually(t, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.closed
	}, 5*time.Second, 5*time.Millisecond, "the last request out closed the engine")
	assert.Empty(t, rds.Keys(t, "*holders*"), "nothing held is left in Redis")
}

func TestShutdownOnExitAnswersWaitersAtOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	b := newRequest(context.Background(), ``).start(h, next)
	time.Sleep(100 * time.Millisecond)

	h.onShutdown(false) // a reload: nothing happens
	select {
	case <-b.done:
		t.Fatal("a reload answered a waiter")
	case <-time.After(100 * time.Millisecond):
	}

	start := time.Now()
	h.onShutdown(true)
	b.wait(t)
	assert.Less(t, time.Since(start), time.Second)
	assert.Equal(t, http.StatusServiceUnavailable, b.w.Code)
	assert.Equal(t, "shutting_down", b.w.Header().Get("Fair-Queue-Reason"))

	select {
	case <-a.done:
		t.Fatal("the running request was cut")
	default:
	}
	next.release <- struct{}{}
	a.wait(t)
	assert.Equal(t, http.StatusOK, a.w.Code)
}

func TestProvisionMakesNoRedisCall(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	h := &Handler{Permits: 3, Redis: &RedisConfig{Addresses: []string{ln.Addr().String()}}}
	require.NoError(t, h.Provision(newContext(t)))
	require.NoError(t, h.Cleanup())
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, conns.Load(), "provision and cleanup connected to Redis")
}

func TestHandlersOfOneConfigMustAgreeOnAQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := newContext(t)
	addr := "127.0.0.1:1"
	provision(t, ctx, addr, &Handler{Name: "q", Permits: 2})
	provision(t, ctx, addr, &Handler{Name: "q", Permits: 2}) // agrees
	provision(t, ctx, addr, &Handler{Name: "other", Permits: 5})

	for _, tc := range []struct {
		h    *Handler
		want string
	}{
		{&Handler{Name: "q", Permits: 3}, "different permits (2 and 3)"},
		{&Handler{Name: "q", Permits: 2, MaxWait: caddy.Duration(time.Minute)}, "different max_wait (20s and 1m0s)"},
		{&Handler{Name: "q", Permits: 2, OnStoreError: FailClosed}, "different on_store_error"},
	} {
		tc.h.Redis = &RedisConfig{Addresses: []string{addr}}
		tc.h.PollInterval = caddy.Duration(50 * time.Millisecond)
		err := tc.h.Provision(ctx)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, err.Error(), `queue "q"`)
		require.NoError(t, tc.h.Cleanup()) // as Caddy does after a failed Provision
	}

	// Another config load (a reload) may change the permits.
	provision(t, newContext(t), addr, &Handler{Name: "q", Permits: 3})
}

func TestProvisionRefusesBadJSONConfig(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name string
		h    *Handler
		want string
	}{
		{"no permits", &Handler{Redis: &RedisConfig{}}, "permits must be at least 1, got 0"},
		{"poll interval too small", &Handler{Permits: 1, PollInterval: caddy.Duration(time.Millisecond), Redis: &RedisConfig{}}, "poll_interval must be at least 50ms"},
		{"poll interval above max wait", &Handler{Permits: 1, MaxWait: caddy.Duration(time.Second), PollInterval: caddy.Duration(2 * time.Second), Redis: &RedisConfig{}}, "poll_interval (2s) must not exceed max_wait (1s)"},
		{"lease too short", &Handler{Permits: 1, Lease: caddy.Duration(time.Millisecond), Redis: &RedisConfig{}}, "lease must be at least 1s"},
		{"bad policy", &Handler{Permits: 1, OnStoreError: "maybe", Redis: &RedisConfig{}}, `on_store_error must be fail_open, fail_closed or local, got "maybe"`},
		{"bad reason", &Handler{Permits: 1, Redis: &RedisConfig{}, Reject: []*RejectConfig{{Reasons: []string{"late"}, Status: 500}}}, `reject[0].reasons[0]: unknown reason "late"`},
		{"bad url", &Handler{Permits: 1, Redis: &RedisConfig{URL: "redis://:{env.FQ_TEST_PW}@host:port"}}, "redis.url: invalid url"},
		{"url and addresses", &Handler{Permits: 1, Redis: &RedisConfig{URL: "redis://a", Addresses: []string{"b:1"}}}, "redis: url and addresses are mutually exclusive"},
		{"cluster with db", &Handler{Permits: 1, Redis: &RedisConfig{Mode: ModeCluster, Addresses: []string{"a:1", "b:1"}, DB: 1}}, "redis.db: must be 0 with mode cluster"},
		{"several addresses without a mode", &Handler{Permits: 1, Redis: &RedisConfig{Addresses: []string{"a:1", "b:1"}}}, "redis.addresses: mode standalone takes one address, got 2"},
		{"sentinel without master", &Handler{Permits: 1, Redis: &RedisConfig{Mode: ModeSentinel, Addresses: []string{"a:1"}}}, "redis.master_name: is required with mode sentinel"},
		{"unknown mode", &Handler{Permits: 1, Redis: &RedisConfig{Mode: "ring"}}, `redis.mode: must be standalone, sentinel or cluster, got "ring"`},
		{"max wait below the smallest poll interval", &Handler{Permits: 1, MaxWait: caddy.Duration(10 * time.Millisecond)}, "max_wait must be at least 50ms (the smallest poll_interval), got 10ms"},
		{"weight without tenant", &Handler{Permits: 1, Weights: map[string]float64{"a": 2}}, "weights: requires tenant"},
		{"weight out of bounds", &Handler{Permits: 1, Tenant: "{http.request.remote.host}", Weights: map[string]float64{"a": 5000}}, "weights[<the value of key sha256:ca978112ca1bbdca>]: must be 0.01 to 1000, got 5000"},
		{"bad cost", &Handler{Permits: 1, Tenant: "x", Cost: "bytes"}, `cost must be requests, max_tokens, time or tokens, got "bytes"`},
		{"max cost with cost time", &Handler{Permits: 1, Tenant: "x", Cost: CostTime, MaxCost: 10}, "max_cost requires cost max_tokens or tokens"},
		{"max cost without cost", &Handler{Permits: 1, Tenant: "x", MaxCost: 10}, "max_cost requires cost max_tokens or tokens"},
		{"cost time in a FIFO queue", &Handler{Permits: 1, Cost: CostTime}, "cost requires tenant or priority"},
		{"negative max in flight", &Handler{Permits: 1, Tenant: "x", MaxInFlightPerTenant: -1}, "max_in_flight_per_tenant must be >= 0, got -1"},
		{"max in flight in a FIFO queue", &Handler{Permits: 1, MaxInFlightPerTenant: 2}, "max_in_flight_per_tenant requires tenant or priority"},
		{"max cost too large", &Handler{Permits: 1, Tenant: "x", Cost: CostMaxTokens, MaxCost: 2e6}, "max_cost must be 1 to 1000000, got 2000000"},
		{"priority factor too small", &Handler{Permits: 1, Priority: "x", PriorityFactor: 1.5}, "priority_factor must be at least 2, got 1.5"},
		{"negative max queue", &Handler{Permits: 1, MaxQueue: -1}, "max_queue must be >= 0, got -1"},
		{"per-tenant cap without tenant", &Handler{Permits: 1, MaxQueuePerTenant: 3}, "max_queue_per_tenant requires tenant"},
		{"local permits without local", &Handler{Permits: 1, LocalPermits: 2}, "local_permits requires on_store_error local"},
		{"negative timeout", &Handler{Permits: 1, Redis: &RedisConfig{ReadTimeout: -1}}, "redis.read_timeout: must be > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("FQ_TEST_PW", "s3cret")
			err := tc.h.Provision(newContext(t))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "s3cret")
			require.NoError(t, tc.h.Cleanup())
		})
	}
}

func TestRedisIdentityHashesThePasswordAndReplacesEnvPlaceholders(t *testing.T) {
	t.Setenv("FQ_TEST_PW", "s3cret")
	b, err := newStore(&RedisConfig{Addresses: []string{"h:1"}, Password: "{env.FQ_TEST_PW}"}, caddy.NewReplacer(), nil)
	require.NoError(t, err)
	rb := b.(*redisBackend)
	assert.Equal(t, "s3cret", rb.opts.Password)
	assert.NotContains(t, b.storeID(), "s3cret")
	assert.Equal(t, "redis|h:1|db=0|prefix=fair_queue", b.dataID())

	other, err := newStore(&RedisConfig{Addresses: []string{"h:1"}, Password: "other"}, caddy.NewReplacer(), nil)
	require.NoError(t, err)
	assert.NotEqual(t, b.storeID(), other.storeID(), "another password is another client")
	assert.Equal(t, b.dataID(), other.dataID(), "but the same queues")

	u, err := newStore(&RedisConfig{URL: "rediss://u:p@h:1/2?dial_timeout=3s"}, caddy.NewReplacer(), nil)
	require.NoError(t, err)
	ub := u.(*redisBackend)
	assert.Equal(t, 3*time.Second, ub.opts.DialTimeout, "a timeout from the URL is kept")
	assert.Equal(t, 500*time.Millisecond, ub.opts.ReadTimeout)
	assert.NotNil(t, ub.opts.TLSConfig)
	assert.Equal(t, 2, ub.opts.DB)
}

func engineOf(t *testing.T, h *Handler) *engine {
	t.Helper()
	list := h.engineList()
	require.Len(t, list, 1)
	return list[0]
}

func TestOldHandlerStillServesAfterCleanup(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1})
	require.NoError(t, h.Cleanup())
	// A request that reaches the old server after the reload (an HTTP/3
	// stream, a late keep-alive request) borrows the queue for itself.
	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.NoError(t, req.err)
	assert.Equal(t, "granted", req.placeholder(phOutcome))
}

func TestOnExitTheLastReferenceClosesTheQueueAtOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	// The exit cuts the running request, which this upstream ignores,
	// and waits for it this handler's abort grace (its default) and a
	// little more (engine.endRunning).
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "exit", Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	require.NotEmpty(t, rds.Keys(t, "*holders*"))
	e := engineOf(t, h)

	exitingForTest.Store(true)
	defer exitingForTest.Store(false)
	require.NoError(t, h.Cleanup()) // the grace period is over
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	assert.True(t, closed, "on exit the queue does not wait for running requests")
	assert.Empty(t, rds.Keys(t, "*holders*"), "this node's permits are released in Redis")

	next.release <- struct{}{}
	a.wait(t)
}

func TestHandlerReturnsWithoutWaitingForThePermitsRelease(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	// A release that waited for this frozen Redis would take the whole
	// read timeout; the request's wait below gives up long before.
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1, Redis: &RedisConfig{
		Addresses: []string{rds.Addr()}, ReadTimeout: caddy.Duration(time.Minute), WriteTimeout: caddy.Duration(time.Minute),
	}})
	freeze := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		rds.Freeze()
		w.WriteHeader(http.StatusOK)
		return nil
	})
	a := newRequest(context.Background(), ``).start(h, freeze).wait(t)
	assert.Equal(t, http.StatusOK, a.w.Code)
	rds.Thaw()
	assert.Eventually(t, func() bool { return len(rds.Keys(t, "*holders*")) == 0 }, 10*time.Second, 10*time.Millisecond,
		"the release completes once Redis answers")
	settled(t, h)
}

// A new config's first request applies its settings to the shared queue;
// the config's other requests that come meanwhile wait for that, rather
// than being granted under the settings of the config it replaces.
func TestRequestsOfANewConfigWaitForItsSettings(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	old := provisionLocal(t, newContext(t), &Handler{Name: "settings-first", Permits: 2, MaxWait: caddy.Duration(time.Minute)})
	up := newHolder()
	t.Cleanup(func() { close(up.release) })
	r0 := newRequest(context.Background(), `{}`).start(old, up)
	up.waitEntered(t)

	cur := provisionLocal(t, newContext(t), &Handler{Name: "settings-first", Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	applying, hold := make(chan struct{}), make(chan struct{})
	var held sync.Once
	unhold := func() { held.Do(func() { close(hold) }) }
	t.Cleanup(unhold)
	configuring = func(e *engine) {
		if e.name == "settings-first" {
			close(applying)
			<-hold
		}
	}
	t.Cleanup(func() { configuring = func(*engine) {} })
	first := newRequest(context.Background(), `{}`).start(cur, up)
	<-applying
	second := newRequest(context.Background(), `{}`).start(cur, up)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, int32(1), up.count.Load(), "granted under the old config's 2 permits beside r0")

	unhold()
	waitingIn(t, cur, 2)
	assert.Equal(t, int32(1), up.count.Load())
	up.release <- struct{}{} // r0 ends: one runs, then the other
	r0.wait(t)
	up.waitEntered(t)
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, int32(2), up.count.Load(), "two at once, above the new config's 1 permit")
	up.release <- struct{}{}
	up.waitEntered(t)
	up.release <- struct{}{}
	first.wait(t)
	second.wait(t)
}
