package redisstore_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// commandStats returns Redis' calls so far: scripts (EVALSHA + EVAL) and
// all commands.
func commandStats(b *testing.B, rdb *redis.Client) (scripts, all int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		all += n
		if name == "cmdstat_evalsha" || name == "cmdstat_eval" {
			scripts += n
		}
	}
	return scripts, all
}

// redisCPU is redisstore.RedisCPU (an internal test file's).
var redisCPU = redisstore.RedisCPU

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkFastPath: acquire + release with a free permit and nobody
// waiting — one script call each.
func BenchmarkFastPath(b *testing.B) {
	srv := redistest.Start(b)
	n := newNode(b, srv, "fast", fairqueue.Config{Permits: 1000})
	admin := srv.Client(b)
	warm, _ := n.q.Acquire(context.Background(), fairqueue.Request{})
	warm.Release()
	c0 := redisCPU(b, admin) // before the counts: its INFO is not counted
	s0, a0 := commandStats(b, admin)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		p.Release()
	}
	b.StopTimer()
	s1, a1 := commandStats(b, admin)
	c1 := redisCPU(b, admin)
	b.ReportMetric(float64((c1-c0).Microseconds())/float64(b.N), "redis-cpu-us/op")
	b.ReportMetric(float64(s1-s0)/float64(b.N), "scripts/op")
	b.ReportMetric(float64(a1-a0-1)/float64(b.N), "cmds/op") // -1: the INFO
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "acquire-p50-us")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "acquire-p99-us")
}

// BenchmarkRoundTrip: a script call that does nothing, the floor of
// every script call's cost: the Redis CPU of reading the call and
// writing its reply, and the round trip. A request on the fast path
// makes two calls (BenchmarkFastPath); what it costs above twice this is
// the scripts' own work.
func BenchmarkRoundTrip(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b, func(o *redis.Options) { o.Protocol = 2 })
	admin := srv.Client(b)
	noop := redis.NewScript("return 1")
	if err := noop.Run(context.Background(), rdb, []string{"{fair_queue:rtt}:k"}).Err(); err != nil {
		b.Fatal(err)
	}
	c0 := redisCPU(b, admin)
	b.ResetTimer()
	for range b.N {
		if err := noop.Run(context.Background(), rdb, []string{"{fair_queue:rtt}:k"}).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((redisCPU(b, admin)-c0).Microseconds())/float64(b.N), "redis-cpu-us/op")
}

// BenchmarkHandoff: a permit released on one node reaches the waiter on
// another node (release script + one Pub/Sub message + one wake-up).
func BenchmarkHandoff(b *testing.B) {
	srv := redistest.Start(b)
	cfg := fairqueue.Config{Permits: 1, MaxWait: time.Minute}
	nodes := []*node{newNode(b, srv, "handoff", cfg), newNode(b, srv, "handoff", cfg)}
	admin := srv.Client(b)
	tag := "{fair_queue:handoff}:waiting"
	p, err := nodes[1].q.Acquire(context.Background(), fairqueue.Request{})
	if err != nil {
		b.Fatal(err)
	}
	p.Release()
	p, err = nodes[0].q.Acquire(context.Background(), fairqueue.Request{})
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		waiter := nodes[(i+1)%2]
		got := make(chan *fairqueue.Permit, 1)
		var at atomic.Int64
		go func() {
			p, err := waiter.q.Acquire(context.Background(), fairqueue.Request{})
			at.Store(time.Now().UnixNano())
			if err != nil {
				b.Error(err)
			}
			got <- p
		}()
		for admin.ZCard(context.Background(), tag).Val() != 1 {
			time.Sleep(20 * time.Microsecond)
		}
		t0 := time.Now()
		p.Release()
		p = <-got
		if p == nil {
			b.FailNow()
		}
		lat = append(lat, time.Duration(at.Load()-t0.UnixNano()))
	}
	b.StopTimer()
	p.Release()
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "handoff-p50-us")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "handoff-p99-us")
}

// BenchmarkQueuedRequest: a closed loop of clients on three nodes keeps
// `waiters` tickets queued behind 4 permits; each op is one request that
// waited its turn. Script calls per request must not grow with the queue,
// in FIFO order or fair across 100 tenants.
func BenchmarkQueuedRequest(b *testing.B) {
	for _, fair := range []bool{false, true} {
		for _, waiters := range []int{100, 5000} {
			b.Run(fmt.Sprintf("fair=%t/waiters=%d", fair, waiters), func(b *testing.B) {
				benchQueued(b, fair, waiters)
			})
		}
	}
}

func benchQueued(b *testing.B, fair bool, waiters int) {
	srv := redistest.Start(b)
	cfg := fairqueue.Config{Permits: 4, MaxWait: 10 * time.Minute, Fair: fair}
	var nodes []*node
	for range 3 {
		nodes = append(nodes, newNode(b, srv, "queued", cfg))
		p, _ := nodes[len(nodes)-1].q.Acquire(context.Background(), fairqueue.Request{})
		p.Release()
	}
	admin := srv.Client(b)
	var done atomic.Int64
	var wg sync.WaitGroup
	ctx, stop := context.WithCancel(context.Background())
	start := make(chan struct{})
	for i := range waiters + 4 {
		wg.Add(1)
		go func(n *node, tenant string) {
			defer wg.Done()
			<-start
			for ctx.Err() == nil {
				p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: tenant})
				if err != nil {
					return
				}
				done.Add(1)
				p.Release()
			}
		}(nodes[i%3], strconv.Itoa(i%100))
	}
	close(start)
	// Let the queue fill before measuring.
	queued := func() int64 {
		return admin.ZCard(context.Background(), "{fair_queue:queued}:waiting").Val() +
			admin.HLen(context.Background(), "{fair_queue:queued}:fticket").Val()
	}
	for queued() < int64(waiters*9/10) {
		time.Sleep(5 * time.Millisecond)
	}
	c0 := redisCPU(b, admin) // before the counts: its INFO is not counted
	s0, a0 := commandStats(b, admin)
	d0 := done.Load()
	b.ResetTimer()
	for done.Load()-d0 < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	s1, a1 := commandStats(b, admin)
	c1 := redisCPU(b, admin)
	n := done.Load() - d0
	b.ReportMetric(float64((c1-c0).Microseconds())/float64(n), "redis-cpu-us/op")
	stop()
	for _, nd := range nodes {
		nd.q.RejectWaiters()
	}
	wg.Wait()
	b.ReportMetric(float64(s1-s0)/float64(n), "scripts/op")
	b.ReportMetric(float64(a1-a0-1)/float64(n), "cmds/op")
}
