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
	h := provisionLocal(t, newContext(t), &Handler{Name: "headers", Permits: 1, MaxBody: 1000, MaxWaitingBytes: 4000 + 2*waitingHead(2),
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

// A body of max_body still waits where max_waiting_bytes is max_body
// (the least it may be, and its default where max_body is over 256
// MiB): alone in the queue, it is let in with its head. Counting the
// head made such a request refused queue_full every time, with nothing
// else waiting.
func TestABodyOfMaxBodyWaitsAloneWithItsHead(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "maxbody-alone", Permits: 1, MaxBody: 1000, MaxWaitingBytes: 1000,
		MaxWait: caddy.Duration(10 * time.Second)})
	next := newHolder()
	ctx := context.Background()
	require.Zero(t, waitingBytes.Load(), "something else waits")
	body := `{"p":"` + strings.Repeat("x", 1000-len(`{"p":""}`)) + `"}`
	require.Len(t, body, 1000)

	holding := newRequest(ctx, `{}`).start(h, next)
	next.waitEntered(t)
	a := newRequest(ctx, body).start(h, next)
	ended := func() bool {
		select {
		case <-a.done:
			return true
		default:
			return false
		}
	}
	require.Eventually(t, func() bool { return queueWaiting(t, "maxbody-alone") == 1 || ended() },
		10*time.Second, time.Millisecond, "a neither waits nor ends")

	next.release <- struct{}{}
	holding.wait(t)
	require.NoError(t, holding.err)
	assert.Equal(t, http.StatusOK, holding.w.Code)
	if ended() {
		t.Fatalf("a body of max_body was refused with nothing else waiting: %d %s", a.w.Code, a.w.Header().Get("Fair-Queue-Reason"))
	}
	next.waitEntered(t)
	next.release <- struct{}{}
	a.wait(t)
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusOK, a.w.Code)
	assert.Zero(t, waitingBytes.Load(), "bytes left counted")
	settled(t, h)
}
