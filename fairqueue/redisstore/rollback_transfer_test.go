package redisstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A local handoff's transfer a failover lost (Redis counts the ended
// request as the holder again, and the request that took its permit as
// a waiter) lets no request of another node in beside the one running,
// nor holds the permit for nobody: once the node subscribes again, Redis
// counts the running request as the holder, and as that alone (not also
// as a waiter, ahead of the other node's in every position and granted
// again when it ends), and the other node's waiter is served when it
// ends; Redis is left clean.
func TestLostTransferIsSortedOut(t *testing.T) {
	const name = "lost-transfer"
	cfg := rollbackCfg
	srv := redistest.Start(t)
	ht := &heldTransfers{calls: make(chan string, 8), go_: make(chan struct{})}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { ht.Store = s; return ht })
	s := sceneOf(t, srv, name, cfg, a, newNode(t, srv, name, cfg))
	w1, w2, w2id := secondInLine(t, a, name)
	behind := acquireAsync(s.b, s.fresh(t))
	s.waiting(t, 2, "b's waiter never queued")

	go w1.p.Release() // a local handoff to w2
	select {
	case to := <-ht.calls:
		require.Equal(t, w2id, to, "the transfer's waiter")
	case <-time.After(5 * time.Second):
		t.Fatal("no local handoff")
	}
	r2 := <-w2
	require.NoError(t, r2.err)
	rollback := snapshot(t, s.admin)
	ht.go_ <- struct{}{} // the transfer: lost
	// Any later transfer goes through.
	go func() {
		for range ht.calls {
			ht.go_ <- struct{}{}
		}
	}()
	eventually(t, 5*time.Second, s.holdsOnly(t, w2id), "the transfer never reached Redis")
	rollback(func() {
		st := s.state(t)
		require.Equal(t, []string{w1.p.Ticket()}, st.Holders, "the rollback brought the ended request back")
		require.Contains(t, st.Waiting, w2id, "and the running one waits again")
	})
	sorted := func() bool {
		st := s.state(t)
		return len(st.Holders) == 1 && st.Holders[0] == w2id && len(st.Waiting) == 1 && st.Waiting[0] != w2id
	}
	for deadline := time.Now().Add(cfg.Lease / 6); !sorted(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis does not count the running request %s as the holder, b's as the one waiting, within %v: %+v",
				w2id, cfg.Lease/6, s.state(t))
		}
	}
	stillWaiting(t, behind, "b's waiter started beside a's running request: 2 running with 1 permit")
	r2.p.Release()
	served(t, behind, "b's waiter", "b's waiter, once a's request ended")
	s.leave(t)
}
