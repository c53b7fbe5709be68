package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Redis restarts without persistence (or a failover loses its data):
// the learned share goes with the rest. Once the instance's heartbeat
// has seen the new data set (and counted its permits again), the queue
// must grant under the share it had learned, not at the ceiling: the
// backend that was overloaded at the ceiling is the same backend.
func TestLearnedShareOutlivesARedisRestartWithoutPersistence(t *testing.T) {
	const name = "learnedrestart"
	srv, a := halvedQueue(t, name)

	restarted := time.Now()
	srv.Restart() // empty
	eventually(t, 10*time.Second, func() bool { return a.q.Stats().Cluster.At.After(restarted) },
		"no heartbeat of a ran after Redis restarted")

	granted := 0
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held []*fairqueue.Permit
		for range 3 {
			p, err := a.q.Acquire(context.Background(), fairqueue.Request{MaxWait: 200 * time.Millisecond})
			if err != nil {
				break
			}
			held = append(held, p)
		}
		for _, p := range held {
			p.Release()
		}
		if granted = len(held); granted == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Redis lost its data the queue grants %d of its 4 permits at once, not the 2 its learned share of 0.5 allows", granted)
		}
	}
	if s := a.q.Share(); s != 0.5 {
		t.Fatalf("a's share is %v after the restart, want 0.5", s)
	}
}

// halvedQueue is a node of the learned queue name (4 permits) on a Redis
// of its own, whose share one breach halved.
func halvedQueue(t *testing.T, name string) (*redistest.Server, *node) {
	t.Helper()
	srv := redistest.Start(t)
	a := newNode(t, srv, name, learnedCfg(200*time.Millisecond, 3*time.Second))
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
	a.q.ObserveTTFT("", time.Second) // a breach: the share halves, 2 of the 4 permits
	halved(t, a, "the share did not move")
	return srv, a
}
