package memstore_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// failingFirstAcquire fails its first Acquire once the test has
// reloaded the queue (a read that timed out: not an outage, so the
// queue sends the call again), and records the permits each Acquire
// carried.
type failingFirstAcquire struct {
	fairqueue.Store
	mu      sync.Mutex
	calls   int
	permits []int
	held    chan struct{} // closed when the first Acquire is in
	go_     chan struct{} // closed by the test after its reload
}

func (f *failingFirstAcquire) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	f.mu.Lock()
	f.calls++
	first := f.calls == 1
	f.permits = append(f.permits, t.Permits)
	f.mu.Unlock()
	if first {
		close(f.held)
		<-f.go_
		return fairqueue.AcquireResult{}, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	}
	return f.Store.Acquire(ctx, t)
}

// An acquire whose call failed is sent again under the settings in force
// then: a reload that lowered the permits while the first call was on its
// way is not undone by the second, which would start the request beside
// the one holder the new permits allow.
func TestAnAcquireSentAgainAfterAReloadCarriesTheNewPermits(t *testing.T) {
	f := &failingFirstAcquire{Store: memstore.New(), held: make(chan struct{}), go_: make(chan struct{})}
	cfg := fairqueue.Config{Name: "resend", Permits: 4, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q, err := fairqueue.New(f, cfg)
	require.NoError(t, err)
	defer func() { _ = q.Close() }()
	f.mu.Lock()
	f.calls = 1 // the holder's acquire goes through
	f.mu.Unlock()
	holder, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	f.mu.Lock()
	f.calls, f.permits = 0, nil
	f.mu.Unlock()

	got := make(chan error, 1)
	go func() {
		p, err := q.Acquire(context.Background(), fairqueue.Request{})
		if err == nil {
			p.Release()
		}
		got <- err
	}()
	<-f.held
	cfg.Permits = 1
	require.NoError(t, q.Reconfigure(cfg))
	close(f.go_)
	select {
	case err := <-got:
		t.Fatalf("the request started beside the holder under 1 permit (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	holder.Release()
	require.NoError(t, <-got)

	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.permits, 2, "the failed acquire was not sent again")
	require.Equal(t, 1, f.permits[1], "the acquire sent again after the reload carried the permits before it")
}
