package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request Redis granted, running when Redis goes away, whose upstream
// refuses it (a pool's 429 or 503: Requeue) waits again as on_store_error
// local says, in the fallback queue, not refused as store_unavailable:
// with `permits 2` and nothing else running it gets a local permit.
func TestLocalFallbackTakesTheRequeueOfARequestRunningAtTheOutage(t *testing.T) {
	nd, running := runningAtTheOutage(t, "fbrunningrequeue", fairqueue.Config{Permits: 2}, fairqueue.Request{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := running[0].Requeue(ctx, -1)
	require.NoError(t, err, "the requeue of a request Redis granted, during the outage")
	assert.True(t, p.Local(), "waited again in the fallback queue")
	if q := tryAcquire(t, nd, fairqueue.Request{}, 5*time.Second); q != nil {
		q.Release()
	} else {
		t.Error("the second permit was not given beside the requeued request")
	}
	p.Release()
}
