package caddyfairqueue

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func TestCaddyfileParsesAnUpstreamPool(t *testing.T) {
	h, err := parse(`fair_queue {
		upstream 10.0.0.5:8000 8
		upstream 10.0.0.6:8000 4
		requeue_on 429 503
		max_requeues 2
		upstream_cooldown 2s
	}`)
	require.NoError(t, err)
	assert.Equal(t, []fairqueue.Upstream{{Dial: "10.0.0.5:8000", Permits: 8}, {Dial: "10.0.0.6:8000", Permits: 4}}, h.Upstreams)
	assert.Equal(t, []int{429, 503}, h.RequeueOn)
	assert.Equal(t, 2, h.maxRequeues())
	assert.Equal(t, 2*time.Second, h.upstreamCooldown())
	assert.Zero(t, h.Permits, "permits defaults to the upstreams' sum at the queue")

	h, err = parse("fair_queue {\nupstream a:1 1\nmax_requeues 0\n}")
	require.NoError(t, err)
	assert.Equal(t, 0, h.maxRequeues(), "0 turns requeueing off")
	h, err = parse("fair_queue {\nupstream a:1 1\n}")
	require.NoError(t, err)
	assert.Equal(t, DefaultMaxRequeues, h.maxRequeues())
	assert.Equal(t, fairqueue.DefaultCooldown, h.upstreamCooldown())
}

func TestCaddyfileRefusesBadPoolOptions(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"no permits and no upstream", "max_wait 1s", "permits is required (or upstream lines"},
		{"upstream without permits", "upstream a:1", "wrong argument count"},
		{"upstream permits zero", "upstream a:1 0", "upstream a:1: permits must be at least 1, got 0"},
		{"upstream permits not a number", "upstream a:1 many", "upstream a:1: permits 'many' is not an integer"},
		{"upstream twice", "upstream a:1 1\nupstream a:1 2", "upstream a:1 is given twice"},
		{"upstream with a space", "upstream \"a 1\" 1", "must not contain spaces"},
		{"permits above the pool", "permits 5\nupstream a:1 2\nupstream b:1 2", "permits (5) is more than the upstreams' permits together (4)"},
		{"requeue_on without upstream", "permits 1\nrequeue_on 503", "requeue_on requires upstream"},
		{"requeue_on a success", "upstream a:1 1\nrequeue_on 200", "requeue_on: status must be 400 to 599, got 200"},
		{"requeue_on not a number", "upstream a:1 1\nrequeue_on busy", "requeue_on: 'busy' is not a status code"},
		{"requeue_on empty", "upstream a:1 1\nrequeue_on", "wrong argument count"},
		{"max_requeues too many", "upstream a:1 1\nmax_requeues 101", "max_requeues must be 0 to 100, got 101"},
		{"max_requeues negative", "upstream a:1 1\nmax_requeues -1", "max_requeues must be at least 0"},
		{"max_requeues without upstream", "permits 1\nmax_requeues 1", "max_requeues requires upstream"},
		{"cooldown too long", "upstream a:1 1\nupstream_cooldown 10m", "upstream_cooldown must be positive and at most 5m0s, got 10m0s"},
		{"cooldown without upstream", "permits 1\nupstream_cooldown 1s", "upstream_cooldown requires upstream"},
		{"pool with a placeholder name", "name {http.fair_queue.model}\nupstream a:1 1", "upstream requires a fixed name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
		})
	}
}

func TestDynamicUpstreamNamesTheGrantOrTheMissingFairQueue(t *testing.T) {
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	_, err := Upstreams{}.GetUpstreams(r)
	require.ErrorIs(t, err, errNoGrant)
	assert.Contains(t, err.Error(), "fair_queue handler with upstream lines")

	grantUpstream(r, caddy.NewReplacer(), "10.0.0.5:8000")
	ups, err := Upstreams{}.GetUpstreams(r)
	require.NoError(t, err)
	require.Len(t, ups, 1)
	assert.Equal(t, "10.0.0.5:8000", ups[0].Dial)
}

// pooled is a next handler standing in for reverse_proxy over a pool: it
// records each call's upstream and body, and answers with the status
// its answer function gives for the upstream.
type pooled struct {
	mu     sync.Mutex
	calls  []string // upstream of each call
	bodies []string
	answer func(call int, upstream string, w http.ResponseWriter) error
}

func (p *pooled) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	up, _ := caddyhttp.GetVar(r.Context(), varUpstream).(string)
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.calls = append(p.calls, up)
	p.bodies = append(p.bodies, string(body))
	n := len(p.calls)
	p.mu.Unlock()
	return p.answer(n, up, w)
}

func refuse(w http.ResponseWriter, status int, retryAfter string) error {
	w.Header().Set("X-Refusal", "leaked")
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"error":"overloaded"}`))
	return nil
}

func answerOK(w http.ResponseWriter) error {
	w.Header().Set("X-Served", "yes")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("ok"))
	return nil
}

func poolRequest(ctx context.Context) *request {
	req := newRequest(ctx, `{"model":"m","messages":[]}`)
	req.r = req.r.WithContext(context.WithValue(req.r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	return req
}

func TestRequeueOnHidesTheRefusalAndSendsTheSameBodyElsewhere(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-requeue",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		RequeueOn: []int{503}})
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		if call == 1 {
			return refuse(w, http.StatusServiceUnavailable, "30")
		}
		return answerOK(w)
	}}
	req := poolRequest(context.Background()).start(h, next).wait(t)
	require.NoError(t, req.err)
	assert.Equal(t, http.StatusOK, req.w.Code)
	assert.Equal(t, "ok", req.w.Body.String(), "only the second answer reaches the client")
	assert.Empty(t, req.w.Header().Get("X-Refusal"), "nothing of the refusal reaches the client")
	assert.Equal(t, "yes", req.w.Header().Get("X-Served"))
	require.Len(t, next.calls, 2)
	assert.NotEqual(t, next.calls[0], next.calls[1], "the refusing upstream cools: the retry goes to the other")
	assert.Equal(t, next.bodies[0], next.bodies[1], "the body is sent again unchanged")
	assert.Equal(t, next.calls[1], req.placeholder(phUpstream))

	// The refusing upstream cools for its Retry-After (30s): the next
	// request goes to the other one too.
	settled(t, h)
	req = poolRequest(context.Background()).start(h, next).wait(t)
	assert.Equal(t, http.StatusOK, req.w.Code)
	assert.Equal(t, next.calls[1], next.calls[2], "a cooling upstream gets no grant")
	snap, err := engineOf(t, h).q.Inspect(context.Background(), 0, 0)
	require.NoError(t, err)
	for _, u := range snap.Upstreams {
		if u.Dial == next.calls[0] {
			assert.Greater(t, u.CoolLeft, 20*time.Second, "cooling for the upstream's Retry-After")
		}
	}
}

func TestRequeuesAreBoundedThenTheRefusalPassesOn(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	two := 2
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-bounded",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		RequeueOn: []int{429}, MaxRequeues: &two, UpstreamCooldown: caddy.Duration(time.Millisecond)})
	next := &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error {
		return refuse(w, http.StatusTooManyRequests, "")
	}}
	req := poolRequest(context.Background()).start(h, next).wait(t)
	require.NoError(t, req.err)
	assert.Len(t, next.calls, 3, "the first try and max_requeues 2")
	assert.Equal(t, http.StatusTooManyRequests, req.w.Code, "the last refusal is the answer")
	assert.Equal(t, `{"error":"overloaded"}`, req.w.Body.String())
	assert.Equal(t, "leaked", req.w.Header().Get("X-Refusal"), "passed on unchanged")
}

func TestUnreachableUpstreamIsRequeuedElsewhere(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-unreachable",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}})
	var dead string
	next := &pooled{answer: func(call int, up string, w http.ResponseWriter) error {
		if call == 1 {
			dead = up
		}
		if up == dead {
			return caddyhttp.Error(http.StatusBadGateway, reverseproxy.NewDialError(errors.New("dial tcp: connection refused")))
		}
		return answerOK(w)
	}}
	req := poolRequest(context.Background()).start(h, next).wait(t)
	require.NoError(t, req.err, "no 502: the request went elsewhere")
	assert.Equal(t, http.StatusOK, req.w.Code)
	require.Len(t, next.calls, 2)
	assert.NotEqual(t, dead, next.calls[1])

	// Other errors are not the upstream's refusal: passed on, no requeue.
	next = &pooled{answer: func(int, string, http.ResponseWriter) error {
		return caddyhttp.Error(http.StatusInternalServerError, errors.New("boom"))
	}}
	settled(t, h)
	req = poolRequest(context.Background()).start(h, next).wait(t)
	he, ok := errors.AsType[caddyhttp.HandlerError](req.err)
	require.True(t, ok, "%v", req.err)
	assert.Equal(t, http.StatusInternalServerError, he.StatusCode)
	assert.Len(t, next.calls, 1)
}

func TestRetryAfterReadsSecondsOrADate(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	assert.Equal(t, 2*time.Second, retryAfter("2", now))
	assert.Equal(t, 90*time.Second, retryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
	assert.Equal(t, fairqueue.MaxCooldown, retryAfter("100000", now))
	for _, v := range []string{"", "0", "-1", "soon", strings.Repeat("9", 40)} {
		assert.Zero(t, retryAfter(v, now), "%q", v)
	}
}

func TestAdminAndMetricsShowEachUpstreamsState(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	zero := 0
	h := provisionLocal(t, newContext(t), &Handler{Name: "pool-state",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 2}},
		RequeueOn: []int{503}, MaxRequeues: &zero})
	// A refusal with max_requeues 0 passes on, and its upstream cools.
	refusing := &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error {
		return refuse(w, http.StatusServiceUnavailable, "60")
	}}
	req := poolRequest(context.Background()).start(h, refusing).wait(t)
	assert.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	cooled := refusing.calls[0]
	settled(t, h)
	// One request holds a permit of the other upstream.
	next := newHolder()
	held := poolRequest(context.Background()).start(h, next)
	next.waitEntered(t)
	t.Cleanup(func() { next.release <- struct{}{}; held.wait(t) })

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1)
	require.NotNil(t, rep.Queues[0].Snapshot, rep.Queues[0].Error)
	ups := rep.Queues[0].Snapshot.Upstreams
	require.Len(t, ups, 2)
	assert.Equal(t, []string{"a:1", "b:1"}, []string{ups[0].Dial, ups[1].Dial}, "in the config's order")
	assert.Equal(t, []int{1, 2}, []int{ups[0].Permits, ups[1].Permits})
	for _, u := range ups {
		if u.Dial == cooled {
			assert.Greater(t, u.CoolLeftMS, int64(50000), "cooling for Retry-After: 60")
			assert.Zero(t, u.InFlight)
		} else {
			assert.Zero(t, u.CoolLeftMS)
			assert.Equal(t, 1, u.InFlight, "the held request")
		}
	}

	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(stateCollector{engines: func() []*engine { return []*engine{engineOf(t, h)} }}))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "upstream" {
					got[strings.TrimPrefix(f.GetName(), "caddy_fair_queue_")+" "+l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	other := map[string]string{"a:1": "b:1", "b:1": "a:1"}[cooled]
	assert.Equal(t, map[string]float64{
		"upstream_permits a:1": 1, "upstream_permits b:1": 2,
		"upstream_in_flight " + cooled: 0, "upstream_in_flight " + other: 1,
		"upstream_cooling " + cooled: 1, "upstream_cooling " + other: 0,
	}, got)
}
