package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Fairness by use through two Caddy instances on one Redis, each case a
// queue of its own. Waits are counted in the upstream's arrival order
// (requests of others that reached it first), not in the machine's
// time, so a loaded machine does not change them.
func TestFairByUseThroughTwoInstances(t *testing.T) {
	rds := redistest.Start(t)
	const delay = 10 * time.Millisecond // per token
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 4, Delay: delay})
	queue := func(name string, permits int, more string) string {
		return fmt.Sprintf(`
	fair_queue @%[1]s {
		name %[1]s
		permits %[2]d
		max_wait 2m
		tenant {http.request.header.X-Tenant}
		%[3]s
		redis {
			url redis://%[4]s/0
		}
	}`, name, permits, more, rds.Addr())
	}
	site := proxySite(upstream, `
	@share header X-Queue share
	@time header X-Queue time
	@cap header X-Queue cap`,
		queue("share", 2, ""), queue("time", 2, "cost time"), queue("cap", 3, "max_in_flight_per_tenant 1"))
	caddies := []*harness.Caddy{harness.StartCaddy(t, "caddy-0", site, harness.CaddyOptions{}), harness.StartCaddy(t, "caddy-1", site, harness.CaddyOptions{})}
	client := newClient(t)
	rdb := rds.Client(t)

	// 2 permits, 40 ms answers: one tenant with ten closed-loop clients,
	// four with one client each (a chat user who waits for the answer
	// before asking again): each gets a fifth of the requests, and a
	// light tenant waits for at most 2 service times of grants to others
	// (4 with 2 permits), plus one the count cannot place: a request
	// granted just before ours was sent, or just after ours was granted,
	// may reach the upstream on the other side of it (the stores' test
	// counts by grant number and holds the 4 exactly).
	t.Run("one-request tenants get their share", func(t *testing.T) {
		quiet(t, mock)
		run := closedLoop{queue: "share", clients: map[string]int{"heavy": 10, "l1": 1, "l2": 1, "l3": 1, "l4": 1}, total: 300}
		got := run.run(t, client, caddies, mock)
		j := jain(got.counts("heavy", "l1", "l2", "l3", "l4"))
		t.Logf("upstream requests per tenant %v: Jain's index %.3f", got.count, j)
		assert.GreaterOrEqual(t, j, 0.98)
		for _, tenant := range []string{"l1", "l2", "l3", "l4"} {
			t.Logf("%s: others' requests ahead p99 %d", tenant, got.p99(t, tenant))
			assert.LessOrEqual(t, got.p99(t, tenant), 4+1, "light tenant %s waits at most 2 service times (2 permits)", tenant)
		}
		assert.LessOrEqual(t, mock.MaxInFlight(), 2, "requests at the upstream at once")
		Queue{rdb: rdb, name: "share"}.awaitWaiting(t, 0, 10*time.Second) // the clients that left are cancelled
	})

	// cost time, two backlogged tenants, one whose answers take 4 times
	// as long: each gets about half the permit-time (counting requests
	// would give the slow one 80%). The permit-time is counted as the
	// upstream's time on each request, not its tokens: cost time charges
	// the real hold, and on a loaded machine a request's hold can exceed
	// its tokens' time many times over.
	t.Run("cost time splits the permit-time", func(t *testing.T) {
		quiet(t, mock)
		tokens := map[string]int{"quick": 1, "slow": 4}
		run := closedLoop{queue: "time", clients: map[string]int{"quick": 4, "slow": 4}, total: 300, tokens: tokens}
		got := run.run(t, client, caddies, mock)
		var all time.Duration
		for _, d := range got.took {
			all += d
		}
		for tenant, d := range got.took {
			share := float64(d) / float64(all)
			t.Logf("%s: %.0f requests, %v at the upstream, %.0f%% of the permit-time", tenant, got.count[tenant], d, 100*share)
			assert.InDelta(t, 0.5, share, 0.08, "tenant %s's share of the permit-time", tenant)
		}
	})

	// max_in_flight_per_tenant 1, 3 permits: a tenant with six clients
	// holds one permit at a time, and two one-client tenants share the
	// other two without waiting for it.
	t.Run("max_in_flight_per_tenant caps a tenant cluster-wide", func(t *testing.T) {
		quiet(t, mock)
		run := closedLoop{queue: "cap", clients: map[string]int{"big": 6}, total: 30}
		run.run(t, client, caddies, mock)
		assert.Equal(t, 1, mock.MaxInFlight(), "a capped tenant alone, with permits free")
		quiet(t, mock)
		run = closedLoop{queue: "cap", clients: map[string]int{"big": 6, "a": 1, "b": 1}, total: 150}
		got := run.run(t, client, caddies, mock)
		for _, tenant := range []string{"a", "b"} {
			t.Logf("%s: %.0f requests, others' requests ahead p99 %d", tenant, got.count[tenant], got.p99(t, tenant))
			assert.LessOrEqual(t, got.p99(t, tenant), 2+1, "tenant %s is not held up by the capped one", tenant)
		}
		assert.LessOrEqual(t, mock.MaxInFlight(), 3, "requests at the upstream at once")
		Queue{rdb: rdb, name: "cap"}.awaitWaiting(t, 0, 10*time.Second) // the clients that left are cancelled
	})
}

// closedLoop runs clients[tenant] clients per tenant, spread over the
// instances, each sending one streamed request after the other, until
// the upstream has seen total requests.
type closedLoop struct {
	queue   string
	clients map[string]int
	tokens  map[string]int // the answer's tokens per tenant (0: the mock's)
	total   int
}

// loopResult is what the upstream saw past the start-up (the first
// tenth of the requests).
type loopResult struct {
	count map[string]float64       // requests per tenant
	took  map[string]time.Duration // per tenant: its requests' time at the upstream
	ahead map[string][]int         // per tenant and request: others' requests that reached the upstream first
}

func (l closedLoop) run(t *testing.T, client *http.Client, caddies []*harness.Caddy, mock *mockllm.Server) loopResult {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	res := loopResult{count: map[string]float64{}, took: map[string]time.Duration{}, ahead: map[string][]int{}}
	var wg sync.WaitGroup
	i := 0
	for tenant, n := range l.clients {
		for c := range n {
			base := caddies[i%len(caddies)].URL()
			i++
			wg.Go(func() {
				for k := 0; ctx.Err() == nil; k++ {
					seq := fmt.Sprintf("%s/%d/%d", tenant, c, k)
					hdr := http.Header{"X-Tenant": {tenant}, "X-Queue": {l.queue}}
					if n := l.tokens[tenant]; n > 0 {
						hdr.Set(mockllm.HeaderTokens, strconv.Itoa(n))
					}
					from := len(mock.Arrivals())
					r := send(ctx, client, base, Chat{Stream: true, Seq: seq, Header: hdr})
					if ctx.Err() != nil {
						return
					}
					if !assert.Equal(t, http.StatusOK, r.Status, "%s: %s", seq, r) {
						stop()
						return
					}
					arrivals := mock.Arrivals()
					if from >= l.total/10 {
						mu.Lock()
						res.ahead[tenant] = append(res.ahead[tenant], slices.Index(arrivals, seq)-from)
						mu.Unlock()
					}
					if len(arrivals) >= l.total {
						stop()
					}
				}
			})
		}
	}
	wg.Wait()
	arrivals := mock.Arrivals()
	require.GreaterOrEqual(t, len(arrivals), l.total)
	// The requests cut short as the clients stop end at their next token.
	require.True(t, eventually(10*time.Second, func() bool { return mock.InFlight() == 0 }), "requests left at the upstream")
	took := mock.ServiceTimes()
	for _, a := range arrivals[l.total/10 : l.total] {
		tenant := strings.SplitN(a, "/", 2)[0]
		res.count[tenant]++
		res.took[tenant] += took[a]
	}
	return res
}

func (r loopResult) counts(tenants ...string) []float64 {
	var xs []float64
	for _, tenant := range tenants {
		xs = append(xs, r.count[tenant])
	}
	return xs
}

// p99 is the 99th percentile of the tenant's requests ahead.
func (r loopResult) p99(t *testing.T, tenant string) int {
	t.Helper()
	as := slices.Clone(r.ahead[tenant])
	require.NotEmpty(t, as, "no requests of tenant %s measured", tenant)
	slices.Sort(as)
	return as[min(len(as)-1, len(as)*99/100)]
}

// jain is Jain's fairness index of xs: 1 when all are equal.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// quiet waits until the upstream has no request of an earlier case left
// (cancelled clients' requests end at its next token), then resets its
// counts, so that one case's requests are not counted in the next.
func quiet(t *testing.T, mock *mockllm.Server) {
	t.Helper()
	require.True(t, eventually(10*time.Second, func() bool { return mock.InFlight() == 0 }), "requests left at the upstream")
	mock.Reset()
}
