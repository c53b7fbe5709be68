package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Fairness by use: usage counters charged at the grant and corrected at
// the release (Permit.Charge), tenants in service are not new, the
// per-tenant in-flight cap, and exact order.
func init() {
	cases = append(cases,
		testCase{"OneRequestTenantsGetTheirShareAgainstAManyRequestTenant", oneAtATime},
		testCase{"ChargedTimeSplitsPermitTimeEvenly", chargedTime},
		testCase{"InFlightCapPassesOverTheCappedTenant", inFlightCap},
		testCase{"TiesGoByArrivalAndHugeCostsKeepTheOrder", exactOrder},
	)
}

// use is one tenant's record in a closed-loop run.
type use struct {
	grants int
	held   time.Duration // permit-time
	// ahead counts, for each grant, the grants made to others while it
	// waited: its wait in units of service (with P permits, P grants are
	// one service time), free of the machine's timing.
	ahead []int
	inUse int        // permits held now
	most  int        // most permits held at once
	order [][2]int64 // {grant no, seq} of each grant
}

// fifo reports whether the tenant's grants were made in arrival order.
func (u *use) fifo() bool {
	o := slices.Clone(u.order)
	slices.SortFunc(o, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	return slices.IsSortedFunc(o, func(a, b [2]int64) int { return int(a[1] - b[1]) })
}

// loop is a closed-loop run: clients[tenant] clients per tenant, spread
// over the nodes, each acquiring, holding for hold(tenant) and releasing
// (charging what charge returns, when set), until `grants` grants were
// made; the first `warm` grants are not recorded.
type loop struct {
	clients map[string]int
	hold    func(tenant string) time.Duration
	cost    float64                       // Request.Cost (0: 1)
	charge  func(d time.Duration) float64 // Permit.Charge of a hold d (nil: none)
	grants  int
	warm    int
}

func (l loop) run(t *testing.T, nodes []*fairqueue.Queue) map[string]*use {
	ctx, stop := context.WithCancel(bg)
	defer stop()
	var mu sync.Mutex
	uses := map[string]*use{}
	for tenant := range l.clients {
		uses[tenant] = &use{}
	}
	n := 0
	var last int64 // the highest grant number seen
	var wg sync.WaitGroup
	i := 0
	for tenant, clients := range l.clients {
		for range clients {
			q := nodes[i%len(nodes)]
			i++
			wg.Go(func() {
				for {
					mu.Lock()
					from := last
					mu.Unlock()
					p, err := q.Acquire(ctx, fairqueue.Request{Tenant: tenant, Cost: l.cost})
					if err != nil {
						return
					}
					mu.Lock()
					u := uses[tenant]
					u.inUse++
					u.most = max(u.most, u.inUse)
					mu.Unlock()
					no := GrantNo(t, p) // while held: see GrantNo
					mu.Lock()
					n++
					record := n > l.warm
					u.order = append(u.order, [2]int64{no, p.Seq()})
					last = max(last, no)
					if record {
						u.grants++
						u.ahead = append(u.ahead, int(max(no-from-1, 0)))
					}
					done := n >= l.grants
					mu.Unlock()
					start := time.Now()
					time.Sleep(l.hold(tenant))
					d := time.Since(start)
					mu.Lock()
					u.inUse--
					if record {
						u.held += d
					}
					mu.Unlock()
					if l.charge != nil {
						p.Charge(l.charge(d))
					}
					p.Release()
					if done {
						stop()
						return
					}
				}
			})
		}
	}
	wg.Wait()
	return uses
}

// p99 is the 99th percentile of xs.
func p99(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*99/100)]
}

// Two permits on two nodes, 40 ms of service: one tenant with ten
// closed-loop clients, four with one client each (a chat user waits for
// its answer before it asks again). The max-min fair share is equal
// (each light tenant wants one permit, the heavy one ten), so each
// tenant gets a fifth of the grants, and a light tenant, in service
// between its requests, is not sent to the back when it returns.
func oneAtATime(t *testing.T, h Harness) {
	const service = 40 * time.Millisecond
	cfg := fairqueue.Config{Name: "oneatatime", Permits: 2, Fair: true, MaxWait: time.Minute}
	nodes := []*fairqueue.Queue{h.NewNode(t, "oneatatime", cfg), h.NewNode(t, "oneatatime", cfg)}
	clients := map[string]int{"heavy": 10, "l1": 1, "l2": 1, "l3": 1, "l4": 1}
	uses := loop{clients: clients, hold: func(string) time.Duration { return service }, grants: 250, warm: 25}.run(t, nodes)
	var xs []float64
	for tenant, u := range uses {
		xs = append(xs, float64(u.grants))
		assert.True(t, u.fifo(), "FIFO inside tenant %s", tenant)
		if tenant != "heavy" {
			// Two service times are 2 x permits grants to others.
			assert.LessOrEqual(t, p99(u.ahead), 2*cfg.Permits, "light tenant %s's wait p99, in grants to others", tenant)
		}
		t.Logf("%s: %d grants, wait p99 %d grants (%d permits)", tenant, u.grants, p99(u.ahead), cfg.Permits)
	}
	j := jain(xs)
	t.Logf("Jain's index over grants %.3f", j)
	assert.GreaterOrEqual(t, j, 0.98)
}

// Two equally backlogged tenants, one holding its permit four times as
// long, each charging the seconds it held: each gets about half of the
// permit-time (counting requests would give the slow one 80%).
func chargedTime(t *testing.T, h Harness) {
	cfg := fairqueue.Config{Name: "chargedtime", Permits: 2, Fair: true, MaxWait: time.Minute}
	nodes := []*fairqueue.Queue{h.NewNode(t, "chargedtime", cfg), h.NewNode(t, "chargedtime", cfg)}
	hold := map[string]time.Duration{"quick": 10 * time.Millisecond, "slow": 40 * time.Millisecond}
	uses := loop{
		clients: map[string]int{"quick": 4, "slow": 4},
		hold:    func(tenant string) time.Duration { return hold[tenant] },
		cost:    0.02, // the estimate charged at the grant: 20 ms
		charge:  func(d time.Duration) float64 { return d.Seconds() },
		grants:  300, warm: 30,
	}.run(t, nodes)
	total := uses["quick"].held + uses["slow"].held
	for tenant, u := range uses {
		share := u.held.Seconds() / total.Seconds()
		t.Logf("%s: %d grants, %.0f%% of the permit-time", tenant, u.grants, 100*share)
		assert.InDelta(t, 0.5, share, 0.08, "tenant %s's share of the permit-time", tenant)
		assert.True(t, u.fifo(), "FIFO inside tenant %s", tenant)
	}
}

// max_in_flight_per_tenant 1: a tenant with six clients never holds more
// than one permit, even with permits free, and its waiters do not block
// the others: they wait about one service time for the one permit they
// share.
func inFlightCap(t *testing.T, h Harness) {
	const service = 20 * time.Millisecond
	cfg := fairqueue.Config{Name: "cap", Permits: 3, Fair: true, MaxWait: time.Minute, MaxInFlightPerTenant: 1}
	nodes := []*fairqueue.Queue{h.NewNode(t, "cap", cfg), h.NewNode(t, "cap", cfg)}
	// Alone, with permits free: one at a time.
	alone := loop{clients: map[string]int{"big": 6}, hold: func(string) time.Duration { return service }, grants: 30}.run(t, nodes)
	assert.Equal(t, 1, alone["big"].most, "a capped tenant alone holds one permit")
	// With two others (two permits for them, each one client): the big
	// tenant still holds one, and the others never wait for it.
	uses := loop{clients: map[string]int{"big": 6, "a": 1, "b": 1}, hold: func(string) time.Duration { return service }, grants: 150, warm: 15}.run(t, nodes)
	assert.Equal(t, 1, uses["big"].most, "the capped tenant holds at most one permit")
	for tenant, u := range uses {
		assert.True(t, u.fifo(), "FIFO inside tenant %s", tenant)
		t.Logf("%s: %d grants, held at most %d, wait p99 %d grants", tenant, u.grants, u.most, p99(u.ahead))
		if tenant != "big" {
			// The two share the two permits the big tenant cannot take:
			// one waits for the other's grant, about one service time.
			assert.LessOrEqual(t, p99(u.ahead), 2, "tenant %s is not held up by the capped one", tenant)
		}
	}
	waiting, holders := h.State(t, "cap")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
}

// With the permit taken, twelve tenants queue one request each, and one
// tenant of huge cost (1e9 a grant: past the 14 digits Lua's tostring
// keeps) queues three: ties at the same usage go by arrival (not by
// tenant name), the huge tenant's own requests stay in arrival order
// across the virtual time's rebase, and the light ones are not pushed
// behind it.
func exactOrder(t *testing.T, h Harness) {
	q := h.NewNode(t, "exact", fairqueue.Config{Permits: 1, Fair: true, MaxWait: time.Minute})
	// Ticket IDs count in base 36: after 30 tickets the twelve cross from
	// "…:z" to "…:10", which sorts first as a string.
	for range 28 {
		p, err := q.Acquire(bg, fairqueue.Request{Tenant: "warm"})
		require.NoError(t, err)
		p.Release()
	}
	first, err := q.Acquire(bg, fairqueue.Request{Tenant: "first"})
	require.NoError(t, err)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	queue := func(label string, req fairqueue.Request, want int) {
		wg.Go(func() {
			p, err := q.Acquire(bg, req)
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			order = append(order, label)
			mu.Unlock()
			p.Release()
		})
		eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "exact"); return len(w) == want }, "%s not queued", label)
	}
	huge := fairqueue.Request{Tenant: "huge", Cost: fairqueue.MaxCost, Weight: 1e-3}
	queue("huge-1", huge, 1)
	var want []string
	for i := range 12 {
		tenant := fmt.Sprintf("t%02d", i)
		queue(tenant, fairqueue.Request{Tenant: tenant}, 2+i)
		want = append(want, tenant)
	}
	queue("huge-2", huge, 14)
	queue("huge-3", huge, 15)
	first.Release()
	wg.Wait()
	// The huge tenant arrived first at the same usage as the others: it
	// is served first, then it has used far more than everyone else.
	want = append(append([]string{"huge-1"}, want...), "huge-2", "huge-3")
	assert.Equal(t, want, order)
}
