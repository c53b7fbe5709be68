package caddyfairqueue

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiting request's headers count against max_waiting_bytes with its
// body: a client that sends large headers (Go's server takes 1 MiB of
// them by default) and an empty body held that much per waiting request
// uncounted, so that max_waiting_bytes bounded nothing of it (a
// thousand such waiters: a GiB).
func TestWaitingHeadersCountAgainstMaxWaitingBytes(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "headers", Permits: 1, MaxBody: 1000, MaxWaitingBytes: 4000,
		MaxWait: caddy.Duration(3 * time.Second)})
	next := newHolder()
	ctx := context.Background()
	base := waitingBytes.Load()
	pad := strings.Repeat("x", 3000)

	holding := newRequest(ctx, `{}`).start(h, next)
	next.waitEntered(t)
	a := newRequest(ctx, `{}`, "X-Pad", pad).start(h, next)
	require.Eventually(t, func() bool { return queueWaiting(t, "headers") == 1 }, 10*time.Second, time.Millisecond, "a is not waiting")
	assert.Greater(t, waitingBytes.Load()-base, int64(3000), "a's headers are not counted")

	// b's headers would take what waits beyond 4000 bytes: refused at once.
	b := newRequest(ctx, `{}`, "X-Pad", pad).start(h, next).wait(t)
	require.NoError(t, b.err)
	assert.Equal(t, http.StatusTooManyRequests, b.w.Code)
	assert.Equal(t, "queue_full", b.w.Header().Get("Fair-Queue-Reason"), "b's headers would take the waiting bytes beyond 4000")

	for _, req := range []*request{holding, a} {
		next.release <- struct{}{}
		req.wait(t)
		require.NoError(t, req.err)
		assert.Equal(t, http.StatusOK, req.w.Code)
		if req == holding {
			next.waitEntered(t)
		}
	}
	assert.Equal(t, base, waitingBytes.Load(), "bytes left counted")
	settled(t, h)
}

// A tenant value cut at maxTenantLen is a copy: a request waiting with a
// tenant taken from a header of a MiB keeps 1 KiB of it, not the MiB.
func TestACutTenantValueKeepsNotTheWholeHeader(t *testing.T) {
	v := strings.Repeat("k", 1<<20)
	cut := tenantValue(v)
	assert.Equal(t, v[:maxTenantLen], cut)
	assert.NotSame(t, unsafe.StringData(v), unsafe.StringData(cut), "the cut value shares the header's memory")
}
