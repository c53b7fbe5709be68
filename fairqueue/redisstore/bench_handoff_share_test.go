package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// countingStore counts how a node hands its permits on: releases
// through the store, and transfers (local handoffs).
type countingStore struct {
	fairqueue.Store
	releases, transfers atomic.Int64
}

func (c *countingStore) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	c.releases.Add(1)
	return c.Store.Release(ctx, t)
}

func (c *countingStore) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	c.transfers.Add(1)
	return c.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// BenchmarkSaturatedHandoffs runs one queue saturated (64 callers over
// 1 or 3 nodes, 4 permits, each request holding its permit for the
// service time) and reports the share of permits handed on locally
// (local-%: transfers among transfers and releases through the store;
// every release has a waiter behind it) and the requests served per
// second.
func BenchmarkSaturatedHandoffs(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		for _, service := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond} {
			b.Run(fmt.Sprintf("nodes=%d/service=%s", nodes, service), func(b *testing.B) {
				benchSaturated(b, nodes, service)
			})
		}
	}
}

func benchSaturated(b *testing.B, nodes int, service time.Duration) {
	srv := redistest.Start(b)
	ctx := context.Background()
	counts := make([]*countingStore, nodes)
	qs := make([]*fairqueue.Queue, nodes)
	for i := range nodes {
		cs := &countingStore{}
		n := wrappedNode(b, srv, "saturated", fairqueue.Config{Permits: 4, MaxWait: time.Minute},
			func(s fairqueue.Store) fairqueue.Store { cs.Store = s; return cs })
		// Join, and let the heartbeat that confirms the node come.
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
		counts[i], qs[i] = cs, n.q
	}
	for _, q := range qs {
		for q.Stats().Cluster.Nodes < nodes {
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(500 * time.Millisecond)
	sum := func() (rel, tr int64) {
		for _, cs := range counts {
			rel, tr = rel+cs.releases.Load(), tr+cs.transfers.Load()
		}
		return rel, tr
	}
	left := atomic.Int64{}
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	rel0, tr0 := sum()
	b.ResetTimer()
	start := time.Now()
	for i := range 64 {
		wg.Add(1)
		go func(q *fairqueue.Queue) {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				p, err := q.Acquire(ctx, fairqueue.Request{})
				if err != nil {
					b.Error(err)
					return
				}
				time.Sleep(service)
				p.Release()
			}
		}(qs[i%nodes])
	}
	wg.Wait()
	b.StopTimer()
	rel, tr := sum()
	rel, tr = rel-rel0, tr-tr0
	b.ReportMetric(100*float64(tr)/float64(max(rel+tr, 1)), "local-%")
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}
