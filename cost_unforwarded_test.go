package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request granted as its client left is not forwarded (outcome
// cancelled): it used nothing, so its tenant is not charged for it. With
// cost tokens, charging its estimate (here 30,000 tokens) would put the
// tenant's next request behind a backlog of others' it never got the
// service of.
func TestGrantNeverForwardedChargesItsTenantNothing(t *testing.T) {
	for _, cost := range []string{CostTokens, CostRequests, CostMaxTokens} {
		t.Run(cost, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			h := provisionLocal(t, newContext(t), &Handler{Name: "unforwarded-" + cost, Permits: 1,
				Tenant: "{http.request.header.X-Tenant}", Cost: cost})
			next := newHolder()
			served := make(chan string, 10)
			seq := recording(next, served)

			// The client has gone by the time the permit is granted: the
			// local queue grants at once, the handler forwards nothing.
			gone, leave := context.WithCancel(context.Background())
			leave()
			left := newRequest(gone, `{"max_tokens":30000}`, "X-Tenant", "left").start(h, seq).wait(t)
			require.Equal(t, outcomeCancelled, left.placeholder(phOutcome))
			assert.Zero(t, next.count.Load(), "not forwarded")
			settled(t, h)

			// A backlog: another tenant's three requests, then one of the
			// tenant whose request never ran, behind a holder.
			body := `{"max_tokens":10}`
			first := newRequest(context.Background(), body, "X-Tenant", "holder").start(h, seq)
			next.waitEntered(t)
			var reqs []*request
			for i, tenant := range []string{"other", "other", "other", "left"} {
				reqs = append(reqs, newRequest(context.Background(), body, "X-Tenant", tenant).start(h, seq))
				waitingIn(t, h, i+1)
			}
			var order []string
			for i := range 5 {
				next.release <- struct{}{}
				order = append(order, <-served)
				if i < 4 {
					next.waitEntered(t)
				}
			}
			first.wait(t)
			for _, r := range reqs {
				r.wait(t)
			}
			// Level with other, which arrived first: other, then left.
			assert.Equal(t, []string{"holder", "other", "left", "other", "other"}, order,
				"a tenant is not charged for a grant its request never used")
		})
	}
}
