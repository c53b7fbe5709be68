package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// leaseWatch polls the queue's liveness entries in Redis (node -> the
// end of its lease) and notes every node whose lease ran out while it was
// listed: a heartbeat later than the lease, on a machine too loaded to
// run one in time. Redis then drops that node's permits and grants them
// anew until the node's next heartbeat counts them again, the window of
// a store fault that docs/failures.md allows. A node that leaves takes its
// entry out before its lease ends, and is not noted.
type leaseWatch struct {
	rdb  *redis.Client
	key  string
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	last   map[string]float64 // each node's lease end at the last sample, in Redis ms
	lapsed []string           // "node (lease end, seen at)" since the last take
}

func startLeaseWatch(t *testing.T, q Queue, addr string) *leaseWatch {
	w := &leaseWatch{
		// Short timeouts: while Redis is frozen, samples are skipped.
		rdb:  redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1, PoolSize: 1}),
		key:  q.key("nodes"),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go w.run()
	t.Cleanup(func() {
		close(w.stop)
		<-w.done
		_ = w.rdb.Close()
	})
	return w
}

func (w *leaseWatch) run() {
	defer close(w.done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		var now *redis.TimeCmd
		var nodes *redis.ZSliceCmd
		_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			now = p.Time(ctx)
			nodes = p.ZRangeWithScores(ctx, w.key, 0, -1)
			return nil
		})
		cancel()
		if err != nil {
			continue
		}
		ms := float64(now.Val().UnixMilli())
		w.mu.Lock()
		for node, end := range w.last {
			if ms > end {
				w.lapsed = append(w.lapsed, fmt.Sprintf("%s (lease end %s, seen at %s)", node,
					time.UnixMilli(int64(end)).Format("15:04:05.000"), now.Val().Format("15:04:05.000")))
			}
		}
		w.last = make(map[string]float64, len(nodes.Val()))
		for _, z := range nodes.Val() {
			if id, _ := z.Member.(string); ms <= z.Score {
				w.last[id] = z.Score
			}
		}
		w.mu.Unlock()
	}
}

// take returns the lapses noted since the last take of nodes other than
// except, and starts over.
func (w *leaseWatch) take(except string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range w.lapsed {
		if except == "" || !strings.HasPrefix(l, except+" ") {
			out = append(out, l)
		}
	}
	w.lapsed = nil
	return out
}
