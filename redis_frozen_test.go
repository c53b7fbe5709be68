package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// frozenMaxWait is the max_wait of the tests on a frozen Redis: far
// above the client's timeouts (about a second), so that a request
// answered by the timeout reject at its max_wait, rather than by
// on_store_error, shows.
const frozenMaxWait = 20 * time.Second

// waitFor waits until req is answered, up to within, and returns how long
// it took from start.
func (req *request) waitFor(t *testing.T, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	select {
	case <-req.done:
	case <-time.After(within):
		t.Fatalf("request not answered within %v", within)
	}
	return time.Since(start)
}

// storeUp reports whether every engine of h reads the store up.
func storeUp(h *Handler) bool {
	for _, e := range h.engineList() {
		if !e.q.Stats().StoreUp {
			return false
		}
	}
	return true
}

// docs/failures.md, "When Redis fails": a frozen Redis (SIGSTOP: the
// connections stay open, nothing answers) never holds a request past its
// max_wait; the request that meets it is answered by on_store_error once
// the client's timeouts run out, and the store is marked down after its
// two failed calls. Each policy's exact answer: fail_closed 503
// store_unavailable, fail_open the upstream without a permit, local the
// upstream on a local permit. Once Redis thaws the store is marked up
// again and the request is granted by Redis.
func TestFrozenRedisIsAnsweredByOnStoreErrorBeforeMaxWait(t *testing.T) {
	for _, tc := range []struct {
		policy  string
		code    int
		reason  string // Fair-Queue-Reason
		outcome string
		ran     bool // the next handler ran
	}{
		{FailClosed, http.StatusServiceUnavailable, "store_unavailable", "store_unavailable", false},
		{FailOpen, http.StatusOK, "", outcomeFailOpen, true},
		{FailLocal, http.StatusOK, "", outcomeGranted, true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			name := "frozen-" + tc.policy
			// A lease of minutes: no heartbeat falls in the freeze, only
			// the request's own calls.
			h := provision(t, newContext(t), rds.Addr(), &Handler{Name: name, Permits: 1, OnStoreError: tc.policy,
				MaxWait: caddy.Duration(frozenMaxWait), Lease: caddy.Duration(10 * time.Minute)})
			require.Equal(t, outcomeGranted, newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome),
				"joined while Redis answers")
			settled(t, h)
			errs := metrics.storeErrors.WithLabelValues(name)
			e0 := testutil.ToFloat64(errs)

			rds.Freeze()
			thawed := false
			t.Cleanup(func() {
				if !thawed {
					rds.Thaw()
				}
			})
			ran := make(chan struct{}, 1)
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
				ran <- struct{}{}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			start := time.Now()
			req := newRequest(context.Background(), `{}`).start(h, next)
			took := req.waitFor(t, start, 2*frozenMaxWait)
			t.Logf("%s on a frozen Redis: %d %q after %v", tc.policy, req.w.Code, req.w.Header().Get("Fair-Queue-Reason"), took)
			assert.Less(t, took, frozenMaxWait, "answered at or past its max_wait")
			assert.Equal(t, tc.code, req.w.Code)
			assert.Equal(t, tc.reason, req.w.Header().Get("Fair-Queue-Reason"))
			assert.Equal(t, tc.outcome, req.placeholder(phOutcome))
			assert.Equal(t, tc.ran, len(ran) == 1, "the upstream reached")
			assert.False(t, storeUp(h), "the store is marked down once the request's calls failed")
			assert.Greater(t, testutil.ToFloat64(errs), e0, "store_errors_total counts the failed calls")
			settled(t, h)

			rds.Thaw()
			thawed = true
			require.Eventually(t, func() bool { return storeUp(h) }, 15*time.Second, 10*time.Millisecond,
				"the store is marked up again once Redis answers")
			require.Eventually(t, func() bool {
				return newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome) == outcomeGranted
			}, 15*time.Second, 50*time.Millisecond, "Redis grants again")
		})
	}
}
