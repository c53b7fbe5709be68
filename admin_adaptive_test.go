package caddyfairqueue

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// refusingUpstream answers every request 429, a refusal that brings a
// learned capacity down; next proxies to it, dial is its address.
func refusingUpstream(t *testing.T) (next caddyhttp.Handler, dial string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"busy"}}`)
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		proxy.ServeHTTP(w, r)
		return nil
	}), u.Host
}

// The admin API's snapshot is the store's (fairqueue.Snapshot): with
// adaptive, the share of the configured capacity in force, the queue's
// or each upstream's, is in it as learned_share (CHANGELOG), so that an
// operator reading `permits 256` and 32 in flight can tell why.
func TestAdminAPIShowsTheLearnedShareOfAnAdaptiveQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		redis bool
		pool  bool
	}{
		{"local", false, false},
		{"redis", true, false},
		{"local pool", false, true},
		{"redis pool", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, dial := refusingUpstream(t)
			h := &Handler{Name: "admin-share-" + tc.name, Permits: 4, MaxWait: caddy.Duration(5 * time.Second),
				Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, Interval: caddy.Duration(100 * time.Millisecond)}}
			if tc.pool {
				h.Permits = 0
				h.Upstreams = []fairqueue.Upstream{{Dial: dial, Permits: 4}}
			}
			if tc.redis {
				h = provision(t, newContext(t), rds.Addr(), h)
			} else {
				h = provisionLocal(t, newContext(t), h)
			}
			srv := serve(t, h, next)
			resp := srv.post(t, context.Background(), `{}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			key := ""
			if tc.pool {
				key = dial
			}
			q := engineOf(t, h).q
			require.Eventually(t, func() bool { s, ok := q.Shares()[key]; return ok && s < 1 }, 5*time.Second, 10*time.Millisecond,
				"the upstream's 429 did not bring the share down: %v", q.Shares())
			want := q.Shares()[key]

			rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
			require.NoError(t, err)
			var rep struct {
				Queues []struct {
					Name     string `json:"name"`
					Snapshot struct {
						LearnedShare *float64 `json:"learned_share"`
						Upstreams    []struct {
							Dial         string   `json:"dial"`
							LearnedShare *float64 `json:"learned_share"`
						} `json:"upstreams"`
					} `json:"snapshot"`
				} `json:"queues"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
			require.Len(t, rep.Queues, 1, rec.Body.String())
			snap := rep.Queues[0].Snapshot
			if !tc.pool {
				require.NotNil(t, snap.LearnedShare, "no learned_share in the snapshot: %s", rec.Body.String())
				assert.InDelta(t, want, *snap.LearnedShare, 1e-9)
				return
			}
			require.Len(t, snap.Upstreams, 1, rec.Body.String())
			assert.Equal(t, dial, snap.Upstreams[0].Dial)
			require.NotNil(t, snap.Upstreams[0].LearnedShare, "no learned_share on the upstream: %s", rec.Body.String())
			assert.InDelta(t, want, *snap.Upstreams[0].LearnedShare, 1e-9)
		})
	}
}
