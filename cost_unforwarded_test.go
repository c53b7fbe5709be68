package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

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

			assertLeftChargedNothing(t, h, next, served, seq, nil)
		})
	}
}

// frozenWriter is a client that takes nothing: the keepalive's comment
// blocks until its bound (frameTimeout) passes, and the request is given
// up (abandoned) rather than forwarded, whether the grant came while the
// comment was blocked or the request left the queue first.
type frozenWriter struct {
	*stuckWriter
	writing chan struct{} // a write has started (and blocks)
}

func newFrozenWriter() *frozenWriter {
	w := &frozenWriter{stuckWriter: newStuckWriter(), writing: make(chan struct{}, 1)}
	w.buf = 4 << 10 // full: every write blocks
	return w
}

func (f *frozenWriter) Write(b []byte) (int, error) {
	select {
	case f.writing <- struct{}{}:
	default:
	}
	return f.stuckWriter.Write(b)
}

// A grant to a waiting stream whose client takes nothing is not
// forwarded: the tenant is not charged for it either, here its estimate
// of 30,000 tokens.
func TestAGrantToAClientThatTakesNothingChargesItsTenantNothing(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "unforwarded-frozen", Permits: 1,
		Tenant: "{http.request.header.X-Tenant}", Cost: CostTokens, MaxWait: caddy.Duration(time.Minute),
		SSEKeepalive: caddy.Duration(100 * time.Millisecond)})
	next := newHolder()
	served := make(chan string, 10)
	seq := recording(next, served)

	first := newRequest(context.Background(), `{"max_tokens":10}`, "X-Tenant", "holder").start(h, seq)
	next.waitEntered(t)
	frozen := newRequest(context.Background(), `{"stream":true,"max_tokens":30000}`, "X-Tenant", "left")
	w := newFrozenWriter()
	done := make(chan error, 1)
	go func() { done <- h.ServeHTTP(w, frozen.r, seq) }()
	waitingIn(t, h, 1)
	<-w.writing // the first comment, blocked
	next.release <- struct{}{}
	require.Equal(t, "holder", <-served)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the frozen stream's request still runs")
	}
	assert.Equal(t, int32(1), next.count.Load(), "the holder's request alone was forwarded")
	first.wait(t)
	settled(t, h)

	assertLeftChargedNothing(t, h, next, served, seq, nil)
}

// assertLeftChargedNothing queues a backlog behind a holder: another
// tenant's three requests, then one of tenant left, whose request never
// ran. Charged nothing for it, left is level with other, which arrived
// first: other, then left.
// Each request is made ready by prepare, where it is not nil.
func assertLeftChargedNothing(t *testing.T, h *Handler, next *holder, served <-chan string, seq caddyhttp.Handler,
	prepare func(*request) *request) {
	t.Helper()
	if prepare == nil {
		prepare = func(r *request) *request { return r }
	}
	body := `{"max_tokens":10}`
	first := prepare(newRequest(context.Background(), body, "X-Tenant", "holder")).start(h, seq)
	next.waitEntered(t)
	var reqs []*request
	for i, tenant := range []string{"other", "other", "other", "left"} {
		reqs = append(reqs, prepare(newRequest(context.Background(), body, "X-Tenant", tenant)).start(h, seq))
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
	assert.Equal(t, []string{"holder", "other", "left", "other", "other"}, order,
		"a tenant is not charged for a grant its request never used")
}
