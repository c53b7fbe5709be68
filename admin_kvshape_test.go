package caddyfairqueue

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/operations.md, "Admin API": with kv_tokens on an upstream line,
// the upstream lists "its kv_tokens and the tokens_held on it", and the
// snapshot of a queue with kv_tokens has its tokens_held. A client
// reading them (jq .snapshot.upstreams[].tokens_held) reads 0 while
// nothing runs, not a missing field, on either store.
func TestAdminAPIListsTokensHeldOfAnIdleQueueThatCountsTokens(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			h := &Handler{Name: "kv-idle-" + store, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2, KVTokens: 500}},
				PollInterval: caddy.Duration(50 * time.Millisecond)}
			if store == "redis" {
				h.Redis = &RedisConfig{Addresses: []string{redistest.Start(t).Addr()}}
			}
			require.NoError(t, h.Provision(newContext(t)))
			t.Cleanup(func() { _ = h.Cleanup() })
			next := newHolder()
			req := newRequest(t.Context(), `{"max_tokens":10}`).start(h, next)
			next.waitEntered(t)
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)

			rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
			require.NoError(t, err)
			var rep struct {
				Queues []struct {
					Snapshot map[string]json.RawMessage `json:"snapshot"`
				} `json:"queues"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep), rec.Body.String())
			require.Len(t, rep.Queues, 1, rec.Body.String())
			snap := rep.Queues[0].Snapshot
			require.NotNil(t, snap, rec.Body.String())
			assert.Equal(t, "0", string(snap["tokens_held"]), "the snapshot's tokens_held: %s", rec.Body.String())
			var ups []json.RawMessage
			require.NoError(t, json.Unmarshal(snap["upstreams"], &ups))
			require.Len(t, ups, 1)
			assert.JSONEq(t, `{"dial":"a:1","permits":2,"in_flight":0,"cool_left_ms":0,"kv_tokens":500,"tokens_held":0}`,
				string(ups[0]))
		})
	}
}
