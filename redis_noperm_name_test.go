package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A queue whose name holds NOPERM, as a client may name
// a model, is in every error of its store ("open {fair_queue:NOPERM}:
// ..."): Redis down is still an outage, not a refusal of the user's
// permissions, which only Redis's own NOPERM answer is. The admin API
// shows no store_refused for it.
func TestAQueueNamedNOPERMWhoseRedisIsDownIsNotRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens there
	h := provision(t, newContext(t), "", &Handler{Name: "NOPERM", Permits: 1, OnStoreError: FailClosed,
		Redis: &RedisConfig{Addresses: []string{addr}}})
	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	engines := h.engineList()
	require.Len(t, engines, 1)
	stats := engines[0].report(context.Background()).Stats
	assert.False(t, stats.StoreUp)
	assert.Empty(t, stats.StoreRefused, "Redis is down, it refused nothing")
}
