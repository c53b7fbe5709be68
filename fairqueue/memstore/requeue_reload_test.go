package memstore_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// failingRequeue fails the Requeue it holds once the test has reloaded
// the queue (a read that timed out: it never ran), and records the
// permits of each Release after it, closing released once one returned.
type failingRequeue struct {
	*memstore.Store
	held     chan struct{} // closed when the Requeue is in
	go_      chan struct{} // closed by the test after its reload
	released chan struct{} // closed when a Release after the Requeue has returned
	once     sync.Once
	mu       sync.Mutex
	failed   bool
	permits  []int
}

func (f *failingRequeue) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	close(f.held)
	<-f.go_
	f.mu.Lock()
	f.failed = true
	f.mu.Unlock()
	return fairqueue.AcquireResult{}, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

func (f *failingRequeue) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	err := f.Store.Release(ctx, t)
	f.mu.Lock()
	after := f.failed
	if after {
		f.permits = append(f.permits, t.Permits)
	}
	f.mu.Unlock()
	if after {
		f.once.Do(func() { close(f.released) })
	}
	return err
}

// A requeue whose call failed gives its old permit back in the
// background, after the cancel of its new ticket: a round trip or two
// after the requeue read its settings. That release dispatches under the
// settings in force as it is sent: a reload that lowered the permits
// while the requeue was on its way must not see a waiter start beside
// the holder the new permits allow.
func TestTheReleaseAfterAFailedRequeueKeepsToAReloadsPermits(t *testing.T) {
	st := memstore.New()
	f := &failingRequeue{Store: st, held: make(chan struct{}), go_: make(chan struct{}), released: make(chan struct{})}
	cfg := fairqueue.Config{Name: "requeuereload", Permits: 2, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q, err := fairqueue.New(f, cfg)
	require.NoError(t, err)
	defer func() { _ = q.Close() }()
	holder, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)

	waiter := make(chan *fairqueue.Permit, 1)
	go func() {
		w, err := q.Acquire(context.Background(), fairqueue.Request{})
		if err != nil {
			w = nil
		}
		waiter <- w
	}()
	require.Eventually(t, func() bool { return len(st.State().Waiting) == 1 }, 10*time.Second, 5*time.Millisecond)
	w := st.State().Waiting[0]

	go func() { _, _ = p.Requeue(context.Background(), -1) }()
	<-f.held
	cfg.Permits = 1
	require.NoError(t, q.Reconfigure(cfg))
	close(f.go_) // the requeue fails: p's permit is given back in the background
	select {
	case <-f.released:
	case <-time.After(30 * time.Second):
		t.Fatal("the permit of the failed requeue was not given back")
	}

	s := st.State()
	assert.NotContains(t, s.Holders, w, "the waiter started beside the holder under 1 permit")
	assert.Len(t, s.Holders, 1)
	f.mu.Lock()
	assert.Equal(t, 1, f.permits[0], "the release after the failed requeue carried the permits before the reload")
	f.mu.Unlock()
	holder.Release()
	if got := <-waiter; got != nil {
		got.Release()
	}
}
