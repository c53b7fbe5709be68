package storetest

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"ATinyWeightNeverOvertakesAHeavierTenant", tinyWeight},
		testCase{"AHugePriorityFactorKeepsTheTopBandFair", hugeFactor},
	)
}

// Request.Weight: a tenant's share relative to others. A positive
// weight too small to divide by (a subnormal, whose inverse is +Inf)
// gets the least share, not every grant: tenant L (such a weight)
// queues 3 requests, then H (weight 1) 3; on 1 permit, once L's first
// is served (it arrived first, both flows level), H's three go before
// L's second. Both stores; the queue keeps serving.
func tinyWeight(t *testing.T, h Harness) {
	for i, w := range []float64{math.SmallestNonzeroFloat64, 1e-310} {
		name := fmt.Sprintf("tinyweight%d", i)
		q := h.NewNode(t, name, fairqueue.Config{Permits: 1, MaxWait: time.Minute, Fair: true})
		holder, err := q.Acquire(bg, fairqueue.Request{Tenant: "h"})
		require.NoError(t, err)
		type grant struct {
			tenant string
			p      *fairqueue.Permit
		}
		granted := make(chan grant, 6)
		for _, r := range []fairqueue.Request{
			{Tenant: "L", Weight: w}, {Tenant: "L", Weight: w}, {Tenant: "L", Weight: w},
			{Tenant: "H", Weight: 1}, {Tenant: "H", Weight: 1}, {Tenant: "H", Weight: 1},
		} {
			queued := make(chan struct{})
			r.OnQueued = func(fairqueue.Waiting) { close(queued) }
			go func() {
				p, err := q.Acquire(bg, r)
				if err == nil {
					granted <- grant{r.Tenant, p}
				}
			}()
			<-queued // in this order
		}
		holder.Release()
		var order string
		for range 6 {
			select {
			case g := <-granted:
				order += g.tenant
				g.p.Release()
			case <-time.After(30 * time.Second):
				t.Fatalf("weight %v: the queue stopped serving after %q", w, order)
			}
		}
		assert.Equal(t, "LHHHLL", order, "weight %v: grants in order, L's weight the least", w)
	}
}

// Config.PriorityFactor has no maximum: with one whose cube passes
// float64's range (1e103), band 3 is still served fairly across its
// tenants, also at a Request.Cost below 1 (0.5: a charge of half the
// least float64 rounds to 0), each permit charged what it was estimated
// at (Permit.Charge: the correction must not take the charge back to 0
// either). A queues 3 band-3 requests, then B 3; on 1
// permit they alternate, A first (level, arrived first), as in any band.
func hugeFactor(t *testing.T, h Harness) {
	for _, cost := range []float64{1, 0.5} {
		q := h.NewNode(t, fmt.Sprintf("hugefactor%v", cost), fairqueue.Config{Permits: 1, MaxWait: time.Minute, Fair: true, PriorityFactor: 1e103})
		holder, err := q.Acquire(bg, fairqueue.Request{Tenant: "h"})
		require.NoError(t, err)
		type grant struct {
			tenant string
			p      *fairqueue.Permit
		}
		granted := make(chan grant, 6)
		for _, tenant := range []string{"A", "A", "A", "B", "B", "B"} {
			queued := make(chan struct{})
			r := fairqueue.Request{Tenant: tenant, Priority: 3, Cost: cost, OnQueued: func(fairqueue.Waiting) { close(queued) }}
			go func() {
				if p, err := q.Acquire(bg, r); err == nil {
					granted <- grant{tenant, p}
				}
			}()
			<-queued // in this order
		}
		holder.Release()
		var order string
		for range 6 {
			select {
			case g := <-granted:
				order += g.tenant
				g.p.Charge(cost)
				g.p.Release()
			case <-time.After(30 * time.Second):
				t.Fatalf("cost %v: the queue stopped serving after %q", cost, order)
			}
		}
		assert.Equal(t, "ABABAB", order, "cost %v: band-3 grants in order", cost)
	}
}
