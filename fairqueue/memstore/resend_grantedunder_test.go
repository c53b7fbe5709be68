package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// A request granted at once by an acquire sent again after a failed
// call reports the permits that call carried (Permit.GrantedUnder), the
// settings in force as it went out, not those read before the first
// call: a reload between the two lowered them, and the grant was made
// under the lowered ones (the route of the config in force may serve it).
func TestAGrantOfAnAcquireSentAgainNamesThePermitsItCarried(t *testing.T) {
	f := &failingFirstAcquire{Store: memstore.New(), held: make(chan struct{}), go_: make(chan struct{})}
	cfg := fairqueue.Config{Name: "resendunder", Permits: 2, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q, err := fairqueue.New(f, cfg)
	require.NoError(t, err)
	defer func() { _ = q.Close() }()

	type result struct {
		p   *fairqueue.Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := q.Acquire(context.Background(), fairqueue.Request{})
		got <- result{p, err}
	}()
	<-f.held
	cfg.Permits = 1
	require.NoError(t, q.Reconfigure(cfg))
	close(f.go_)
	r := <-got
	require.NoError(t, r.err)
	defer r.p.Release()

	f.mu.Lock()
	require.Equal(t, []int{2, 1}, f.permits, "the acquire was not sent again under the reload's permits")
	f.mu.Unlock()
	require.Zero(t, r.p.Position(), "not granted at once by the acquire sent again")
	assert.Equal(t, 1, r.p.GrantedUnder(), "the grant names the permits read before the first call, not those its call carried")
}
