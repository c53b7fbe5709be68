package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A burst has ended and left a backlog; the operator reloads with more
// permits. No new request comes: the backlog must drain under the new
// permits all the same, where the old config's waiters stay within
// their upstream's permits on their own route. Each case runs with the
// local store and with Redis.

// backlogClients and backlogTokens shape the backlog: ten streams of
// six tokens 80 ms apart, one at a time before the reload.
const (
	backlogClients = 10
	backlogTokens  = 6
	backlogDelay   = 80 * time.Millisecond
)

// drainAfterReload runs backlogClients streams under before, reloads to
// after once all but the one running wait, sends nothing more, and
// checks that every stream is served in full. It returns the replicas,
// for the caller to check what ran on each.
func drainAfterReload(t *testing.T, redis bool, queue string, before, after func(a, b *replica, store string) string) (a, b *replica) {
	t.Helper()
	store := ""
	if redis {
		rds := redistest.Start(t)
		store = fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", rds.Addr())
	}
	cfg := mockllm.Config{Tokens: backlogTokens, Delay: backlogDelay}
	a, b = startReplica(t, cfg), startReplica(t, cfg)
	c := harness.StartCaddy(t, "caddy", before(a, b, store), harness.CaddyOptions{GracePeriod: 30 * time.Second})
	client := newClient(t)
	var all collect
	for i := range backlogClients {
		all.send(context.Background(), client, c.URL(), "c"+strconv.Itoa(i), Chat{Stream: true, Seq: "c" + strconv.Itoa(i)})
	}
	// A queue named from the request opens with its first request: the
	// admin API shows it once one runs.
	require.True(t, eventually(10*time.Second, func() bool {
		return a.mock.MaxInFlight()+b.mock.MaxInFlight() > 0
	}), "no request reached the upstreams")
	require.True(t, eventually(10*time.Second, func() bool {
		return localStats(t, c, queue).Waiting >= backlogClients-2
	}), "clients not queued: %+v", localStats(t, c, queue))
	require.NoError(t, c.Load(after(a, b, store)))
	results := all.wait(t, 2*time.Minute)
	require.Len(t, results, backlogClients)
	for name, r := range results {
		requireFullStream(t, r, backlogTokens, "client %s", name)
	}
	return a, b
}

func eachStore(t *testing.T, run func(t *testing.T, redis bool)) {
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "local store", true: "redis store"}[redis], func(t *testing.T) {
			// Each store's case has its own Caddy, replicas and Redis,
			// and spends its time waiting on the streams.
			t.Parallel()
			run(t, redis)
		})
	}
}

// Permits raised from 1 to 3 in front of the same upstream: the backlog
// runs three at a time at once, not one at a time until a new request
// comes.
func TestAReloadThatRaisesThePermitsDrainsTheBacklogWithoutANewRequest(t *testing.T) {
	eachStore(t, func(t *testing.T, redis bool) {
		a, _ := drainAfterReload(t, redis, "llm",
			func(a, _ *replica, store string) string { return staticSite(a, 1, store) },
			func(a, _ *replica, store string) string { return staticSite(a, 3, store) })
		assert.Equal(t, 3, a.mock.MaxInFlight(), "the backlog ran under the new permits")
		assert.Equal(t, backlogClients, a.mock.Served())
	})
}

// Permits raised from 1 to 3 with the upstream moved from A to B: the
// old config's waiters run on their own route, A, which must never run
// more than the one permit it was given. Their route under the new
// config (B) is known only once it serves a request, so the new permits
// wait for one.
func TestAReloadThatRaisesThePermitsAndMovesTheUpstreamKeepsTheOldUpstreamWithinItsPermits(t *testing.T) {
	eachStore(t, func(t *testing.T, redis bool) {
		a, b := drainAfterReload(t, redis, "llm",
			func(a, _ *replica, store string) string { return staticSite(a, 1, store) },
			func(_, b *replica, store string) string { return staticSite(b, 3, store) })
		assert.Equal(t, 1, a.mock.MaxInFlight(), "replica A at once")
		assert.Equal(t, backlogClients, a.mock.Served()+b.mock.Served())
	})
}

// A pool's permits raised from 1 to 2 on each upstream: a grant names
// its upstream, so the backlog runs under the new permits at once.
func TestAReloadThatRaisesAPoolsPermitsDrainsTheBacklogWithoutANewRequest(t *testing.T) {
	pool := func(permits int) func(a, b *replica, store string) string {
		return func(a, b *replica, store string) string {
			return fmt.Sprintf(`
	fair_queue {
		name llm
		max_wait 60s
		upstream %s %d
		upstream %s %d
		%s
	}
	reverse_proxy {
		dynamic fair_queue
		flush_interval -1
	}`, a.addr, permits, b.addr, permits, store)
		}
	}
	eachStore(t, func(t *testing.T, redis bool) {
		a, b := drainAfterReload(t, redis, "llm", pool(1), pool(2))
		assert.LessOrEqual(t, a.mock.MaxInFlight(), 2, "replica A at once")
		assert.LessOrEqual(t, b.mock.MaxInFlight(), 2, "replica B at once")
		assert.Equal(t, 4, a.mock.MaxInFlight()+b.mock.MaxInFlight(), "the backlog ran under the new permits")
		assert.Equal(t, backlogClients, a.mock.Served()+b.mock.Served())
	})
}

// A queue named from the request (one per model), its permits raised
// from 1 to 3 in front of the same upstream: the new config's handler
// that names queues as the old one did serves it, and the backlog runs
// under its permits at once.
func TestAReloadThatRaisesThePermitsOfAQueueNamedFromTheRequestDrainsTheBacklog(t *testing.T) {
	eachStore(t, func(t *testing.T, redis bool) {
		a, _ := drainAfterReload(t, redis, "mock", perModel(1, false), perModel(3, false))
		assert.Equal(t, 3, a.mock.MaxInFlight(), "the backlog ran under the new permits")
		assert.Equal(t, backlogClients, a.mock.Served())
	})
}

// perModel is a site with one queue per model, of permits each, in
// front of A (or B).
func perModel(permits int, onB bool) func(a, b *replica, store string) string {
	return func(a, b *replica, store string) string {
		up := a
		if onB {
			up = b
		}
		return proxySite(up.addr, fmt.Sprintf(`
	fair_queue {
		name {http.fair_queue.model}
		permits %d
		max_wait 60s
		%s
	}`, permits, store))
	}
}

// A queue named from the request, its permits raised from 1 to 3 with
// the upstream moved from A to B: the old config's waiters keep their
// own route, A, which must never run more than its one permit.
func TestAReloadThatRaisesThePermitsOfAQueueNamedFromTheRequestAndMovesItKeepsTheOldUpstreamWithinItsPermits(t *testing.T) {
	eachStore(t, func(t *testing.T, redis bool) {
		a, b := drainAfterReload(t, redis, "mock", perModel(1, false), perModel(3, true))
		assert.Equal(t, 1, a.mock.MaxInFlight(), "replica A at once")
		assert.Equal(t, backlogClients, a.mock.Served()+b.mock.Served())
	})
}

// The upstream's address read from a variable set before fair_queue:
// the text after fair_queue stays the same while the reload moves the
// variable from A to B and raises the permits from 1 to 3. The old
// config's waiters have A in their variable, which must never run more
// than its one permit.
func TestAReloadThatMovesAnUpstreamReadFromAVariableKeepsTheOldUpstreamWithinItsPermits(t *testing.T) {
	eachStore(t, func(t *testing.T, redis bool) {
		site := func(up *replica, permits int, store string) string {
			return proxySite("{vars.upstream}", "\tvars upstream "+up.addr, fmt.Sprintf(`
	fair_queue {
		name llm
		permits %d
		max_wait 60s
		%s
	}`, permits, store))
		}
		a, b := drainAfterReload(t, redis, "llm",
			func(a, _ *replica, store string) string { return site(a, 1, store) },
			func(_, b *replica, store string) string { return site(b, 3, store) })
		assert.Equal(t, 1, a.mock.MaxInFlight(), "replica A at once")
		assert.Equal(t, backlogClients, a.mock.Served()+b.mock.Served())
	})
}
