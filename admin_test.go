package caddyfairqueue

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// getStatus calls the admin API's handler as Caddy's admin server would.
func getStatus(t *testing.T, method, path string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	rec := httptest.NewRecorder()
	routes := adminAPI{}.Routes()
	require.Len(t, routes, 1)
	require.Equal(t, "/fair_queue/", routes[0].Pattern)
	err := routes[0].Handler.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec, err
}

func TestAdminAPIModuleIsRegisteredUnderAdminAPI(t *testing.T) {
	mod, err := caddy.GetModule("admin.api.fair_queue")
	require.NoError(t, err)
	_, ok := mod.New().(caddy.AdminRouter)
	assert.True(t, ok)
}

func TestAdminAPIListsQueuesWithLiveStateFromTheirStores(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	require.NoError(t, rds.Client(t).Do(context.Background(),
		"ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all").Err())
	ctx := newContext(t)
	hr := &Handler{Name: "admin-redis", Permits: 2, PollInterval: caddy.Duration(50 * time.Millisecond),
		Redis: &RedisConfig{URL: "redis://alice:s3cret@" + rds.Addr() + "/0"}}
	hl := &Handler{Name: "admin-local", Permits: 1, PollInterval: caddy.Duration(50 * time.Millisecond)}
	for _, h := range []*Handler{hr, hl} {
		require.NoError(t, h.Provision(ctx))
		t.Cleanup(func() { _ = h.Cleanup() })
	}
	next := newHolder()
	var reqs []*request
	for _, h := range []*Handler{hr, hr, hl} {
		reqs = append(reqs, newRequest(context.Background(), `{}`).start(h, next))
		next.waitEntered(t)
	}
	reqs = append(reqs, newRequest(context.Background(), `{}`).start(hr, next)) // waits
	t.Cleanup(func() {
		for range reqs {
			next.release <- struct{}{}
		}
		for _, r := range reqs {
			r.wait(t)
		}
	})
	waitingIn(t, hr, 1)

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	assert.NotContains(t, rec.Body.String(), "s3cret", "no password, ever")
	assert.NotContains(t, rec.Body.String(), "alice", "no credentials at all")
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 2)

	local := rep.Queues[0] // sorted by name
	assert.Equal(t, "admin-local", local.Name)
	assert.Equal(t, "local", local.Store)
	assert.Equal(t, 1, local.Permits)
	assert.Equal(t, engineOf(t, hl).q.Node(), local.Node)
	require.NotNil(t, local.Stats)
	assert.Equal(t, nodeReport{InFlight: 1, StoreUp: true, Grants: local.Stats.Grants}, *local.Stats)
	require.NotNil(t, local.Snapshot, local.Error)
	assert.Len(t, local.Snapshot.Holders, 1)
	assert.Equal(t, 0, local.Snapshot.Waiting)

	rq := rep.Queues[1]
	assert.Equal(t, "admin-redis", rq.Name)
	require.Equal(t, "redis", rq.Store)
	require.NotEmpty(t, rq.Address, "no store description: newEngine must keep b.describe()")
	assert.Equal(t, rds.Addr(), rq.Address)
	assert.Equal(t, ModeStandalone, rq.Mode)
	assert.Equal(t, 0, rq.DB)
	assert.Equal(t, redisstore.DefaultKeyPrefix, rq.KeyPrefix)
	assert.Equal(t, 2, rq.Permits)
	assert.Equal(t, int64(20000), rq.MaxWaitMS)
	assert.Equal(t, int64(30000), rq.LeaseMS)
	node := engineOf(t, hr).q.Node()
	assert.Equal(t, node, rq.Node)
	require.NotNil(t, rq.Stats)
	assert.Equal(t, 1, rq.Stats.Waiting)
	assert.Equal(t, 2, rq.Stats.InFlight)
	assert.True(t, rq.Stats.StoreUp)
	require.NotNil(t, rq.Snapshot, rq.Error)
	assert.Equal(t, 1, rq.Snapshot.Waiting)
	require.Len(t, rq.Snapshot.Head, 1)
	assert.Contains(t, rq.Snapshot.Head[0], node+":")
	require.Len(t, rq.Snapshot.Holders, 2)
	for _, h := range rq.Snapshot.Holders {
		assert.Equal(t, node, h.Node)
		assert.Greater(t, h.LeaseLeftMS, int64(0))
	}
	require.Len(t, rq.Snapshot.Nodes, 1)
	assert.Equal(t, node, rq.Snapshot.Nodes[0].ID)
	assert.True(t, rq.Snapshot.Nodes[0].Alive)
	assert.Equal(t, int64(2), rq.Snapshot.Grants)
	// The cluster view is the store's now, as the snapshot is: not the
	// last heartbeat's, from before the waiter came.
	assert.Equal(t, &clusterReport{Waiting: 1, InFlight: 2, Nodes: 1}, rq.Cluster)
	assert.Equal(t, &clusterReport{Waiting: 0, InFlight: 1, Nodes: 1}, local.Cluster)
}

func TestAdminAPIShowsTheStoreErrorOfAQueueItCannotRead(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := &Handler{Name: "admin-down", Permits: 1, PollInterval: caddy.Duration(50 * time.Millisecond),
		Redis: &RedisConfig{Addresses: []string{deadAddr(t)}}}
	require.NoError(t, h.Provision(newContext(t)))
	t.Cleanup(func() { _ = h.Cleanup() })

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1)
	assert.Equal(t, "admin-down", rep.Queues[0].Name)
	assert.Nil(t, rep.Queues[0].Snapshot)
	assert.NotEmpty(t, rep.Queues[0].Error, "the queue is listed, with why its state is missing")
}

func TestAdminAPIIsReadOnly(t *testing.T) {
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		_, err := getStatus(t, method, "/fair_queue/")
		var apiErr caddy.APIError
		require.True(t, errors.As(err, &apiErr), method)
		assert.Equal(t, http.StatusMethodNotAllowed, apiErr.HTTPStatus, method)
	}
	_, err := getStatus(t, http.MethodGet, "/fair_queue/other")
	var apiErr caddy.APIError
	require.True(t, errors.As(err, &apiErr))
	assert.Equal(t, http.StatusNotFound, apiErr.HTTPStatus)
}

func TestAdminAPIListsNoQueuesAsAnEmptyList(t *testing.T) {
	poolEmpty(t)
	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	assert.JSONEq(t, `{"queues":[]}`, rec.Body.String())
}
