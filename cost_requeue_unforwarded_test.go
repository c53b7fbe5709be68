package caddyfairqueue

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request whose upstream refused it waits again; when its client takes
// nothing meanwhile, the new grant is given up, never forwarded: its
// tenant is not charged for it (here its estimate of 30,000 tokens), as
// for a first grant that is not forwarded.
func TestARequeuedGrantNeverForwardedChargesItsTenantNothing(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "unforwarded-requeue",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}, RequeueOn: []int{503},
		Tenant: "{http.request.header.X-Tenant}", Cost: CostTokens, MaxWait: caddy.Duration(time.Minute),
		SSEKeepalive: caddy.Duration(100 * time.Millisecond)})
	next := newHolder()
	served := make(chan string, 10)
	rec := recording(next, served)
	var refused atomic.Bool
	seq := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if r.Header.Get("X-Tenant") == "left" && refused.CompareAndSwap(false, true) {
			// The only upstream refuses and cools 1s: the request waits again.
			return refuse(w, http.StatusServiceUnavailable, "1")
		}
		return rec.ServeHTTP(w, r)
	})
	withVars := func(req *request) *request {
		req.r = req.r.WithContext(context.WithValue(req.r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		return req
	}

	frozen := withVars(newRequest(context.Background(), `{"stream":true,"max_tokens":30000}`, "X-Tenant", "left"))
	w := newFrozenWriter()
	done := make(chan error, 1)
	go func() { done <- h.ServeHTTP(w, frozen.r, seq) }()
	<-w.writing // its second wait's first comment, blocked
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the frozen stream's request still runs")
	}
	require.True(t, refused.Load())
	assert.Zero(t, next.count.Load(), "the frozen stream's new grant was not forwarded")
	settled(t, h)

	assertLeftChargedNothing(t, h, next, served, seq, withVars)
}
