package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// FLUSHALL (an operator's, or a failover to an empty replica without a
// restart the clients see) loses the learned share as a restart without
// persistence does (docs/adaptive.md): the instances' heartbeats find the
// new data set and put back the share they last heard of, so the queue
// grants under it again, not at its ceiling for good.
func TestLearnedShareOutlivesAFlushall(t *testing.T) {
	const name = "learnedflushall"
	srv, a := halvedQueue(t, name)

	flushed := time.Now()
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool { return a.q.Stats().Cluster.At.After(flushed) },
		"no heartbeat of a ran after FLUSHALL")
	eventually(t, 10*time.Second, func() bool {
		v, err := srv.Client(t).HGet(context.Background(), redisstore.TagOf("", name)+":adapt", "s:").Result()
		return err == nil && v == "0.5"
	}, "the learned share was not put back after FLUSHALL")
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
	if len(held) != 2 {
		t.Fatalf("after FLUSHALL the queue grants %d of its 4 permits at once, not the 2 its learned share of 0.5 allows", len(held))
	}
}
