package fairqueue

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// nopermReply is an error as go-redis gives Redis's NOPERM answer: a
// reply's error (it has RedisError), which Refused reads.
type nopermReply string

func (e nopermReply) Error() string { return string(e) }
func (nopermReply) RedisError()     {}

// A call that succeeds as another is refused (NOPERM: an ACL that lacks
// one key or command, so that some calls pass and others do not) may
// read the store's state before the refusal marks it down and clear the
// down mark after: the store was then up with the refusal still set, and
// `store_refused` (the admin API's stats, `status --redis`) stayed until
// the next refusal came and went, also over a later outage that was no
// refusal. Whichever comes last, the refusal shows only while the store
// is down. Each round races one success with one refusal, the success
// started a random few steps apart (the race is a few instructions wide:
// on main 0.1 to 0.5% of the rounds ended up with the refusal set).
func TestARefusalShowsOnlyWhileTheStoreIsDown(t *testing.T) {
	log := zap.NewNop()
	refusal := nopermReply("NOPERM this user has no permissions to run the 'evalsha' command")
	const rounds = 100000
	hs := make([]health, rounds+1)
	delays := make([]int, rounds+1)
	for r := range hs {
		hs[r].downAfter.Store(1)
		delays[r] = rand.IntN(64)
	}
	var round, done atomic.Int64
	defer round.Store(rounds) // a failed round: the goroutine runs the rest and ends
	go func() {
		for r := int64(1); r <= rounds; r++ {
			spinUntil(&round, r)
			for range delays[r] {
				spun.Add(1)
			}
			hs[r].ok(log)
			done.Store(r)
		}
	}()
	for r := int64(1); r <= rounds; r++ {
		round.Store(r)
		hs[r].failed(log, refusal)
		spinUntil(&done, r)
		if h := &hs[r]; h.up() {
			require.Empty(t, h.refusedBy(), "round %d: the store is up, its refusal still shown", r)
		}
	}
}

// spun is what the success's delay counts.
var spun atomic.Int64

// spinUntil waits until v reaches n, spinning: the two calls of a round
// start within a few instructions of each other.
func spinUntil(v *atomic.Int64, n int64) {
	for i := 0; v.Load() < n; i++ {
		if i%1024 == 1023 {
			runtime.Gosched() // on one CPU, or with the other goroutine off its CPU
		}
	}
}
