package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The admin API's stats are this instance's view, and the status page
// shows stats.grants in its "this instance" column beside the cluster's
// count: it is the grants of this instance's requests, as
// grants_total counts them, not the queue's counter as this instance
// last heard of it (with its last grant), which counts every instance's.
func TestAdminAPIStatsGrantsAreThisInstances(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "admin-node-grants"
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: name, Permits: 5})
	require.Equal(t, "granted", newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome))
	settled(t, h)

	// Another instance grants 3 requests of its own.
	other, err := fairqueue.New(redisstore.New(rds.Client(t), name, redisstore.Options{}),
		fairqueue.Config{Name: name, Permits: 5})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	for range 3 {
		p, err := other.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	// This instance's second request: its grant tells it the queue's
	// counter.
	require.Equal(t, "granted", newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome))

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1, rec.Body.String())
	q := rep.Queues[0]
	require.NotNil(t, q.Stats)
	require.NotNil(t, q.Snapshot, q.Error)
	assert.Equal(t, int64(5), q.Snapshot.Grants, "the queue's grants, all instances")
	assert.Equal(t, int64(2), q.Stats.Grants, "this instance granted 2")
}
