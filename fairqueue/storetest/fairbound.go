package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"ATenantWithARequestRunningKeepsItsCounterAndPassesThatManyGrants", runningCredit},
	)
}

// What the fairness bound is (docs/design.md, "Fairness"): a flow is
// lifted to the least counter of the ready flows only when it becomes
// active (no waiter and no permit held before), not when it queues
// again while one of its requests runs. So a tenant B whose one request
// runs while tenant A is served n times keeps its counter (1, with cost
// 1): its next requests pass A's waiter, which queued before them, n-1
// times in a row (as many as the grants A got meanwhile beyond B's
// one), then A's waiter goes (level, it arrived first). The lead grows
// with the grants A gets while B's request runs: no fixed number of
// overtakes bounds it. Had B's request ended first, B would start level
// with A and A's waiter would go first. A band does not change it: a
// band-1 waiter of tenant H that came after A's grants starts at V
// (n-1, nothing ready) and B, in band 0, passes it n-2 times. Both
// stores, 2 permits.
func runningCredit(t *testing.T, h Harness) {
	const n = 9 // A's grants while B's request runs
	for _, c := range []struct {
		bEnds  bool
		waiter fairqueue.Request
		want   string
	}{
		{false, fairqueue.Request{Tenant: "A"}, strings.Repeat("B", n-1) + "AB"},               // B's counter 1, A's n
		{true, fairqueue.Request{Tenant: "A"}, "A" + strings.Repeat("B", n)},                   // B starts level with A
		{false, fairqueue.Request{Tenant: "H", Priority: 1}, strings.Repeat("B", n-2) + "HBB"}, // H's counter n-1
	} {
		bEnds := c.bEnds
		name := fmt.Sprintf("runningcredit%v%s", bEnds, c.waiter.Tenant)
		q := h.NewNode(t, name, fairqueue.Config{Permits: 2, MaxWait: time.Minute, Fair: true})
		b1, err := q.Acquire(bg, fairqueue.Request{Tenant: "B"})
		require.NoError(t, err)
		var a *fairqueue.Permit
		for i := range n {
			if i > 0 {
				a.Release()
			}
			a, err = q.Acquire(bg, fairqueue.Request{Tenant: "A"}) // the free permit
			require.NoError(t, err)
		}
		if bEnds {
			b1.Release()
			// Take its permit, so that the waiters below wait.
			b1, err = q.Acquire(bg, fairqueue.Request{Tenant: "C"})
			require.NoError(t, err)
		}
		type grant struct {
			tenant string
			p      *fairqueue.Permit
		}
		granted := make(chan grant, n+1)
		reqs := []fairqueue.Request{c.waiter}
		for range n {
			reqs = append(reqs, fairqueue.Request{Tenant: "B"})
		}
		for _, r := range reqs {
			queued := make(chan struct{})
			r.OnQueued = func(fairqueue.Waiting) { close(queued) }
			go func() {
				if p, err := q.Acquire(bg, r); err == nil {
					granted <- grant{r.Tenant, p}
				}
			}()
			<-queued // the waiter first, then B's
		}
		a.Release()
		var order string
		for range reqs {
			select {
			case g := <-granted:
				order += g.tenant
				g.p.Release()
			case <-time.After(30 * time.Second):
				t.Fatalf("the queue stopped serving after %q", order)
			}
		}
		assert.Equal(t, c.want, order, "B's request ended first: %v; waiter %+v", bEnds, c.waiter)
		b1.Release()
	}
}
