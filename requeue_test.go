package caddyfairqueue

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// An upstream that times out or breaks its answer after it had the
// request may have run it: it cools, but the request is not sent again;
// the client gets the error, as without a pool.
func TestUpstreamThatFailedPastTheDialCoolsWithoutARequeue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-failed",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		RequeueOn: []int{503}, UpstreamCooldown: caddy.Duration(time.Minute)})
	next := &pooled{answer: func(int, string, http.ResponseWriter) error {
		return caddyhttp.Error(http.StatusGatewayTimeout, errors.New("net/http: timeout awaiting response headers"))
	}}
	req := poolRequest(context.Background()).start(h, next).wait(t)
	he, ok := errors.AsType[caddyhttp.HandlerError](req.err)
	require.True(t, ok, "%v", req.err)
	assert.Equal(t, http.StatusGatewayTimeout, he.StatusCode)
	require.Len(t, next.calls, 1, "not sent again: the upstream may have run it")
	settled(t, h)
	snap, err := engineOf(t, h).q.Inspect(context.Background(), 0, 0)
	require.NoError(t, err)
	for _, u := range snap.Upstreams {
		if u.Dial == next.calls[0] {
			assert.Positive(t, u.CoolLeft, "the upstream cools")
		}
	}
}

// Trailers an upstream sets after the body reach the client through a
// pool as they do without one.
func TestPooledAnswerKeepsItsTrailers(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-trailers",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}, RequeueOn: []int{503}})
	next := &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error {
		w.Header().Set("Trailer", "X-Usage")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
		w.Header().Set("X-Usage", "42")
		return nil
	}}
	req := poolRequest(context.Background()).start(h, next).wait(t)
	require.NoError(t, req.err)
	assert.Equal(t, "42", req.w.Result().Trailer.Get("X-Usage"))
}

// A streaming request requeued while the keepalive feeds it shows its
// place in every queue event of its second wait too.
func TestRequeuedStreamKeepsShowingItsPlace(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-keepalive",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}, RequeueOn: []int{503},
		SSEKeepalive: caddy.Duration(100 * time.Millisecond), SSEQueueEvents: true})
	hold := newHolder()
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		switch call {
		case 1:
			return hold.ServeHTTP(w, nil)
		case 2: // the stream's first grant: refused; the only upstream cools 1s
			return refuse(w, http.StatusServiceUnavailable, "1")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
		return nil
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{})
		ctx = context.WithValue(ctx, caddyhttp.ExtraLogFieldsCtxKey, new(caddyhttp.ExtraLogFields))
		r = r.WithContext(ctx)
		caddyhttp.NewTestReplacer(r)
		if err := h.ServeHTTP(w, r, next); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)

	holder := poolRequest(context.Background()).start(h, next)
	hold.waitEntered(t)
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: {\"position\"") {
			events = append(events, line)
			if len(events) == 2 {
				hold.release <- struct{}{} // the first wait had its events: the permit frees
			}
		}
		if line == "data: [DONE]" {
			break
		}
	}
	holder.wait(t)
	require.Len(t, next.calls, 3, "the holder, the refused try, the served one")
	require.Greater(t, len(events), 4, "queue events of both waits")
	for _, e := range events {
		assert.NotContains(t, e, `"position":null`, "every queue event shows the place: %v", events)
	}
}

// An upstream that refused a request whose client left meanwhile still
// cools: the refusal was the upstream's, whoever waits for the answer.
func TestRefusalCoolsItsUpstreamWhenTheClientLeft(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-left",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}, RequeueOn: []int{503}})
	ctx, cancel := context.WithCancel(context.Background())
	next := &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error {
		cancel() // the client leaves while the upstream answers
		return refuse(w, http.StatusServiceUnavailable, "60")
	}}
	req := poolRequest(ctx).start(h, next).wait(t)
	require.NoError(t, req.err)
	require.Len(t, next.calls, 1, "nobody to requeue for")
	settled(t, h)
	snap, err := engineOf(t, h).q.Inspect(context.Background(), 0, 0)
	require.NoError(t, err)
	cooled := false
	for _, u := range snap.Upstreams {
		cooled = cooled || (u.Dial == next.calls[0] && u.CoolLeft > 50*time.Second)
	}
	assert.True(t, cooled, "the refusing upstream cools for its Retry-After: %+v", snap.Upstreams)
}
