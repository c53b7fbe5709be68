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

// BenchmarkSaturatedHandoffs runs one node saturated (64 callers, 4
// permits, each request holding its permit for the service time) and
// reports the share of permits handed on locally (local-%: transfers
// among transfers and releases through the store; every release has a
// waiter behind it) and the requests served per second.
func BenchmarkSaturatedHandoffs(b *testing.B) {
	for _, service := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond} {
		b.Run(fmt.Sprintf("service=%s", service), func(b *testing.B) {
			srv := redistest.Start(b)
			cs := &countingStore{}
			n := wrappedNode(b, srv, "saturated", fairqueue.Config{Permits: 4, MaxWait: time.Minute},
				func(s fairqueue.Store) fairqueue.Store { cs.Store = s; return cs })
			ctx := context.Background()
			// Join, and let the heartbeat that confirms the node come.
			p, err := n.q.Acquire(ctx, fairqueue.Request{})
			if err != nil {
				b.Fatal(err)
			}
			p.Release()
			for n.q.Stats().Cluster.Nodes == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(500 * time.Millisecond)
			left := atomic.Int64{}
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			rel0, tr0 := cs.releases.Load(), cs.transfers.Load()
			b.ResetTimer()
			start := time.Now()
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						p, err := n.q.Acquire(ctx, fairqueue.Request{})
						if err != nil {
							b.Error(err)
							return
						}
						time.Sleep(service)
						p.Release()
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			rel, tr := cs.releases.Load()-rel0, cs.transfers.Load()-tr0
			b.ReportMetric(100*float64(tr)/float64(max(rel+tr, 1)), "local-%")
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
