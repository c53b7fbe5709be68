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
// with A and A's waiter would go first. A waiter's band does not change
// it: a band-1 waiter of tenant H that came after A's grants starts at V
// (n-1, nothing ready) and B, in band 0, passes it n-2 times. Nor does
// the band below's anti-starvation: with B in band 1 (its grants
// charged 1/8) and A's 3 grants, B passes A's band-0 waiter 23 times in
// a row, not at most 8. Both stores, 2 permits.
func runningCredit(t *testing.T, h Harness) {
	for i, c := range []struct {
		n      int // A's grants while B's request runs
		bBand  int
		bEnds  bool
		waiter fairqueue.Request
		bs     int // B's requests queued behind the waiter
		want   string
	}{
		{9, 0, false, fairqueue.Request{Tenant: "A"}, 9, strings.Repeat("B", 8) + "AB"},               // B's counter 1, A's 9
		{9, 0, true, fairqueue.Request{Tenant: "A"}, 9, "A" + strings.Repeat("B", 9)},                 // B starts level with A
		{9, 0, false, fairqueue.Request{Tenant: "H", Priority: 1}, 9, strings.Repeat("B", 7) + "HBB"}, // H's counter 8
		{3, 1, false, fairqueue.Request{Tenant: "A"}, 24, strings.Repeat("B", 23) + "AB"},             // B's 1/8, A's 3
	} {
		bEnds := c.bEnds
		q := h.NewNode(t, fmt.Sprintf("runningcredit%d", i), fairqueue.Config{Permits: 2, MaxWait: time.Minute, Fair: true})
		b1, err := q.Acquire(bg, fairqueue.Request{Tenant: "B", Priority: c.bBand})
		require.NoError(t, err)
		var a *fairqueue.Permit
		for i := range c.n {
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
		granted := make(chan grant, c.bs+1)
		reqs := []fairqueue.Request{c.waiter}
		for range c.bs {
			reqs = append(reqs, fairqueue.Request{Tenant: "B", Priority: c.bBand})
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
		assert.Equal(t, c.want, order, "case %d: B's request ended first: %v; waiter %+v", i, bEnds, c.waiter)
		b1.Release()
	}
}
