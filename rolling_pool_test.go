package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A rolling change that gives a queue a pool: this instance has it
// (`upstream` lines, `dynamic fair_queue`), another instance not yet
// (1 permit, no pool). The other's release grants this instance's
// waiter, on no upstream, since it knows no pool. The waiter is counted
// on every upstream of the pool, so it may run on any of them: it must
// reach the upstream and get its answer, not reverse_proxy's error for a
// request that holds no upstream grant.
func TestAPlainGrantFromAnInstanceWithoutThePoolReachesAnUpstreamOfIt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	u := newPeakUpstream(t)
	u.open()

	// The other instance, not given the pool yet, holds the only permit.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	other, err := fairqueue.New(redisstore.New(rds.Client(t), "rolling", redisstore.Options{}),
		fairqueue.Config{Permits: 1, MaxWait: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	held, err := other.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)

	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"rolling","upstreams":[{"dial":%q,"permits":1}],"max_wait":"1m","redis":{"addresses":[%q]}},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`,
		port, u.dial(), rds.Addr())), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	type answer struct {
		code int
		body string
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json",
			strings.NewReader(`{"messages":[]}`))
		if err != nil {
			answered <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- answer{resp.StatusCode, string(b)}
	}()
	rdb := rds.Client(t)
	require.Eventually(t, func() bool {
		n, _ := rdb.ZCard(ctx, "{fair_queue:rolling}:waiting").Result()
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the request waits")

	held.Release() // the other instance's release grants the waiter
	select {
	case a := <-answered:
		assert.Equal(t, http.StatusOK, a.code, "body %q", a.body)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer")
	}
	assert.EqualValues(t, 1, u.most.Load(), "the request reached the pool's upstream")
}
