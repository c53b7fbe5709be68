package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
)

// chaosLoad is a fixed number of streaming clients, each sending one
// request after another to the live Caddy instances in turn, recording
// when and how each request was answered.
type chaosLoad struct {
	client  *http.Client
	timeout time.Duration // per request: a hang shows as a late error, not a stuck test

	mu      sync.Mutex
	targets []*harness.Caddy
	next    int
	results []loadResult

	stop chan struct{}
	wg   sync.WaitGroup
}

// loadResult is one request of the load.
type loadResult struct {
	caddy  string
	start  time.Time
	answer time.Duration // until the response headers (a grant or a reject) or the error
	status int
	reason string // Fair-Queue-Reason, "" when granted
	full   bool   // a granted stream arrived whole
	err    error
}

func (r loadResult) String() string {
	return fmt.Sprintf("%s at %s: %d reason=%q full=%t answer after %v err=%v",
		r.caddy, r.start.Format("15:04:05.000"), r.status, r.reason, r.full, r.answer.Round(time.Millisecond), r.err)
}

// startChaosLoad starts clients streaming clients against targets.
func startChaosLoad(t *testing.T, clients int, timeout time.Duration, targets []*harness.Caddy) *chaosLoad {
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true}
	l := &chaosLoad{client: &http.Client{Transport: tr}, timeout: timeout, targets: slices.Clone(targets), stop: make(chan struct{})}
	t.Cleanup(func() {
		l.Stop()
		tr.CloseIdleConnections()
	})
	for range clients {
		l.wg.Go(l.run)
	}
	return l
}

// SetTargets replaces the instances new requests go to.
func (l *chaosLoad) SetTargets(targets []*harness.Caddy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.targets = slices.Clone(targets)
}

// Stop stops the clients after their current request and waits for
// them.
func (l *chaosLoad) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// Results returns every request recorded so far.
func (l *chaosLoad) Results() []loadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.results)
}

func (l *chaosLoad) target() *harness.Caddy {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.targets[l.next%len(l.targets)]
	l.next++
	return c
}

func (l *chaosLoad) run() {
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		c := l.target()
		r := l.one(c)
		l.mu.Lock()
		l.results = append(l.results, r)
		l.mu.Unlock()
		if r.err != nil || r.reason != "" {
			// A rejected client backs off a little, as a real one would
			// (fail_closed answers at once).
			select {
			case <-l.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

func (l *chaosLoad) one(c *harness.Caddy) loadResult {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	r := loadResult{caddy: c.Name(), start: time.Now()}
	resp, err := l.client.Do(Chat{Stream: true}.request(ctx, c.URL()))
	r.answer = time.Since(r.start)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	r.status, r.reason = resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")
	b, err := io.ReadAll(resp.Body)
	r.err = err
	r.full = err == nil && r.reason == "" && strings.HasSuffix(string(b), "data: [DONE]\n\n")
	return r
}

// nodeID returns the node ID of c in queue name, from its admin API.
func nodeID(t *testing.T, c *harness.Caddy, name string) string {
	t.Helper()
	status, body := getBody(t, c.AdminURL()+"/fair_queue/")
	if status != http.StatusOK {
		t.Fatalf("%s admin status: %d %s", c.Name(), status, body)
	}
	var rep struct {
		Queues []struct {
			Name string `json:"name"`
			Node string `json:"node"`
		} `json:"queues"`
	}
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatalf("%s admin status: %v: %s", c.Name(), err, body)
	}
	for _, q := range rep.Queues {
		if q.Name == name && q.Node != "" {
			return q.Node
		}
	}
	t.Fatalf("%s serves no queue %q: %s", c.Name(), name, body)
	return ""
}

// holderSampler polls the number of permits held in Redis, as the queue
// itself counts them, and keeps the highest count since the last take,
// with the holders (ticket and lease expiry) of the sample that first saw it,
// so that a count above the permits names its tickets.
type holderSampler struct {
	rdb  *redis.Client
	key  string
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	max    int
	atMax  []redis.Z // the holders when max was first seen
	maxWas time.Time // when
}

func startHolderSampler(t *testing.T, q Queue, addr string) *holderSampler {
	s := &holderSampler{
		// Short timeouts: while Redis is frozen, samples are skipped.
		rdb:  redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1, PoolSize: 1}),
		key:  q.key("holders"),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go s.run()
	t.Cleanup(func() {
		close(s.stop)
		<-s.done
		_ = s.rdb.Close()
	})
	return s
}

func (s *holderSampler) run() {
	defer close(s.done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		n, err := s.rdb.ZCard(ctx, s.key).Result()
		cancel()
		if err != nil {
			continue
		}
		s.mu.Lock()
		higher := int(n) > s.max
		s.mu.Unlock()
		var ids []redis.Z
		if higher { // rare: read who holds them
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			ids, _ = s.rdb.ZRangeWithScores(ctx, s.key, 0, -1).Result()
			cancel()
		}
		s.mu.Lock()
		if int(n) > s.max {
			s.max, s.atMax, s.maxWas = int(n), ids, time.Now()
		}
		s.mu.Unlock()
	}
}

// take returns the highest count since the last take, and starts over.
func (s *holderSampler) take() int {
	m, _ := s.takeHolders()
	return m
}

// takeHolders is take, with a line naming the holders (ticket, lease
// expiry in Redis time) the sampler read when it first saw that count.
func (s *holderSampler) takeHolders() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ids, at := s.max, s.atMax, s.maxWas
	s.max, s.atMax = 0, nil
	var b strings.Builder
	fmt.Fprintf(&b, "at %s:", at.Format("15:04:05.000"))
	for _, z := range ids {
		fmt.Fprintf(&b, " %v (%s)", z.Member, time.UnixMilli(int64(z.Score)).Format("15:04:05.000"))
	}
	return m, b.String()
}
