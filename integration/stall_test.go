package integration

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/faultproxy"
	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// stallLease is the lease of the stall tests: an instance stopped for
// longer than it is dead to Redis, its grants reaped.
const stallLease = 3 * time.Second

// TestStalledInstanceStartsNoGrantRedisTookBack stops an instance
// (SIGSTOP: a long GC pause, a starved CPU) while its waiter
// heads a queue of one permit, and resumes it after its lease. While it
// is stopped, the other instance's request ends and its release grants
// the stopped instance's waiter: the grant's message waits, unread, in
// the stopped instance's socket. The grant's lease ends unrenewed, Redis
// takes the permit back and grants it to a request of the other
// instance. Once resumed, the instance reads the old grant: it must not
// start its waiter beside the request that now holds the permit (the
// upstream would run 2 with 1 permit, after the stall, where nothing
// excuses it); the waiter is served once the permit is free, within its
// max_wait.
//
// The same with a's link to Redis frozen (a blackhole: TCP stays up,
// nothing gets through) for as long, then healed: the bytes held go out,
// the grant's message among them.
func TestStalledInstanceStartsNoGrantRedisTookBack(t *testing.T) {
	if testing.Short() {
		t.Skip("about 30s: skipped with -short")
	}
	t.Run("sigstop", func(t *testing.T) {
		t.Parallel()
		runStall(t, func(a *harness.Caddy, _ *faultproxy.Proxy) { a.Signal(syscall.SIGSTOP) },
			func(a *harness.Caddy, _ *faultproxy.Proxy) { a.Signal(syscall.SIGCONT) })
	})
	t.Run("frozen-link", func(t *testing.T) {
		t.Parallel()
		runStall(t, func(_ *harness.Caddy, p *faultproxy.Proxy) { p.Blackhole(true) },
			func(_ *harness.Caddy, p *faultproxy.Proxy) { p.Heal() })
	})
}

// runStall runs the scenario above, stopping instance a (which reaches
// Redis through a fault proxy) with stop and resuming it with resume.
func runStall(t *testing.T, stop, resume func(*harness.Caddy, *faultproxy.Proxy)) {
	rds := redistest.Start(t)
	proxy := faultproxy.Start(t, rds.Addr())
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond})
	site := func(redisAddr string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name stall
		permits 1
		max_wait 60s
		poll_interval 100ms
		lease %s
		redis {
			address %s
		}
	}`, stallLease, redisAddr))
	}
	a := harness.StartCaddy(t, "a", site(proxy.Addr()), harness.CaddyOptions{})
	b := harness.StartCaddy(t, "b", site(rds.Addr()), harness.CaddyOptions{})
	stopped := false
	t.Cleanup(func() {
		if stopped {
			resume(a, proxy)
		}
	})
	q := Queue{rdb: rds.Client(t), name: "stall"}
	client := newClient(t)
	ctx := context.Background()

	first := holdPermit(t, client, b.URL(), nil)
	waiter := sendAsync(ctx, client, a.URL(), Chat{Stream: true, Tokens: 4, Delay: 50 * time.Millisecond})
	q.awaitWaiting(t, 1, 10*time.Second)

	stop(a, proxy)
	stopped = true
	// a heartbeat less than a third of its lease ago: alive in Redis
	// for two thirds of a lease more, its waiter is granted.
	first.Release()
	q.awaitWaiting(t, 0, 5*time.Second)
	require.Equal(t, 1, q.Holders(t), "a's waiter granted while a is stopped")

	// Its grant's lease ends unrenewed: Redis grants the permit to b's
	// next request.
	second := holdPermit(t, client, b.URL(), nil)
	require.Equal(t, 1, mock.InFlight(), "b's second request runs alone")

	resume(a, proxy)
	stopped = false
	// Time for a to read the old grant and for its heartbeats to find
	// it had lost its lease.
	ran := eventually(2*stallLease, func() bool { return mock.InFlight() > 1 })
	assert.False(t, ran, "a started its waiter on a grant Redis had taken back, beside b's request")
	assert.Equal(t, 1, mock.MaxInFlight(), "requests at the upstream at once, with 1 permit")

	second.Release()
	r := await(t, waiter, 30*time.Second)
	requireFullStream(t, r, 4, "a's waiter, once the permit is free")
	assert.Equal(t, 1, mock.MaxInFlight(), "requests at the upstream at once, with 1 permit")
	q.awaitHolders(t, 0, 10*time.Second)
}
