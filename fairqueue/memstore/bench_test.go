package memstore_test

import (
	"context"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// BenchmarkHandoff: a release hands the permit to a parked waiter in the
// same process; measured from Release to the waiter's Acquire returning.
func BenchmarkHandoff(b *testing.B) {
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{Permits: 1, MaxWait: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	p, _ := q.Acquire(context.Background(), fairqueue.Request{})
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		got := make(chan time.Time, 1)
		var next *fairqueue.Permit
		go func() {
			var err error
			next, err = q.Acquire(context.Background(), fairqueue.Request{})
			if err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		for q.Stats().Waiting == 0 {
			runtime.Gosched()
		}
		// Let the waiter park, keeping this thread busy: a sleeping
		// thread would add the OS's wake-up time to the measure.
		for t := time.Now(); time.Since(t) < 100*time.Microsecond; {
			runtime.Gosched()
		}
		t0 := time.Now()
		p.Release()
		lat = append(lat, (<-got).Sub(t0))
		p = next
	}
	b.StopTimer()
	p.Release()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1000, "handoff-p50-us")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds())/1000, "handoff-p99-us")
}

// BenchmarkFastPath: acquire + release with a free permit.
func BenchmarkFastPath(b *testing.B) {
	q, _ := fairqueue.New(memstore.New(), fairqueue.Config{Permits: 1 << 20})
	defer q.Close()
	b.ReportAllocs()
	for range b.N {
		p, err := q.Acquire(context.Background(), fairqueue.Request{})
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}
