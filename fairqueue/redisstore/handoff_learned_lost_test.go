package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The node's own report lowers the learned share in Redis, but its reply
// is lost (a timeout: the call ran, the answer never came back). The
// node still holds the heads a reply named while it was alone, and
// knows nothing of the share: a permit that ends must not start the
// next one while more than the learned permits run. A failed report
// leaves the node in doubt of the share, as a lowered one would.
func TestLocalHandoffKeepsToAShareItsOwnReportLoweredWhenTheReplyWasLost(t *testing.T) {
	const name = "learnedlostreply"
	longHeads(t) // a's heads still serve when its report has failed
	ctx := context.Background()
	ls := &lostReplyStore{}
	errs := &storeErrors{}
	cfg := learnedCfg(time.Second, 30*time.Second)
	cfg.Observer = errs
	a := wrappedNode(t, redistest.Start(t), name, cfg, func(s fairqueue.Store) fairqueue.Store { ls.Store = s; return ls })
	held := holdFour(t, a)
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, w2 := queueWaiter(t, a, name)
	alive(t, a)
	named := time.Now()
	held[0].Release() // w1 takes it; the reply names w2 the head
	w1 := <-w1Ch
	require.NoError(t, w1.err)

	ls.lose.Store(true)
	a.q.ObserveTTFT("", time.Second) // a breach, reported at once: Redis halves the share, the reply is lost
	adapt := adaptKey(a, name)
	eventually(t, 5*time.Second, func() bool { return a.rdb.HGet(ctx, adapt, "s:").Val() == "0.5" },
		"a's report never lowered the share (window %v)", a.rdb.HGetAll(ctx, adapt).Val())
	eventually(t, 5*time.Second, func() bool { return errs.n.Load() > 0 }, "a never saw its report fail")
	require.Equal(t, 1.0, a.q.Share(), "a heard of the share its lost reply carried")
	require.Less(t, time.Since(named), longHeadsTTL, "a's heads were spent before its report failed")

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}

// errLostReply is the error of a call whose reply was lost.
var errLostReply = errors.New("the reply was lost")

// lostReplyStore is a Store whose Adapt, once lose is set, runs in Redis
// and then fails as if its reply had been lost.
type lostReplyStore struct {
	fairqueue.Store
	lose atomic.Bool
}

func (s *lostReplyStore) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return s.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

func (s *lostReplyStore) Adapt(ctx context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	shares, err := s.Store.(fairqueue.Adapter).Adapt(ctx, a)
	if err == nil && s.lose.Load() {
		return nil, errLostReply
	}
	return shares, err
}

// storeErrors is an Observer that counts the failed store calls.
type storeErrors struct{ n atomic.Int32 }

func (o *storeErrors) Granted(time.Duration, bool)              {}
func (o *storeErrors) Rejected(fairqueue.Reason, time.Duration) {}
func (o *storeErrors) Handoff(time.Duration)                    {}
func (o *storeErrors) StoreError(error)                         { o.n.Add(1) }
