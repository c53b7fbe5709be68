package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// stubbornUpstream runs each request for its whole time whether or not
// its client (the proxy) is still there, as a model server that notices
// an abort late: a body with "refuse" is answered 429 at once, one with
// "hold" runs until released, any other runs for run. It counts the
// requests it runs at once (most) and those that reached it (total).
type stubbornUpstream struct {
	url                  string
	release              chan struct{}
	run                  time.Duration
	total, running, most atomic.Int32
}

func newStubbornUpstream(t *testing.T, run time.Duration) *stubbornUpstream {
	t.Helper()
	u := &stubbornUpstream{release: make(chan struct{}, 1), run: run}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body := string(b)
		u.total.Add(1)
		if strings.Contains(body, "refuse") {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		n := u.running.Add(1)
		defer u.running.Add(-1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		end := make(chan struct{})
		if strings.Contains(body, "hold") {
			go func() { <-u.release; close(end) }()
		} else {
			time.AfterFunc(u.run, func() { close(end) })
		}
		if !strings.Contains(body, `"stream":true`) {
			<-end // the abort is not noticed
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			_, _ = io.WriteString(w, "data: {}\n\n") // its errors are not noticed either
			w.(http.Flusher).Flush()
			select {
			case <-end:
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(u.release) })
	u.url = srv.URL
	return u
}

func (u *stubbornUpstream) dial() string { return strings.TrimPrefix(u.url, "http://") }

// storeJSON is the store part of a fair_queue handler's JSON: the local
// store, or a real redis-server started for t.
func storeJSON(t *testing.T, store string) string {
	t.Helper()
	if store == "local" {
		return ""
	}
	return fmt.Sprintf(`,"redis":{"addresses":[%q]}`, redistest.Start(t).Addr())
}

// A client that leaves while its upstream runs the request, which the
// upstream does not notice for a while (shorter than abort_grace): the
// permit and the request's kv_tokens stay held until the grace has run
// out, so that the next request never runs beside it at the upstream,
// plain and streamed, held back by permits or by kv_tokens, on each
// store and over each protocol.
func TestAbortedRequestTheUpstreamRunsOnNeverRunsBesideTheNextOverEachProtocol(t *testing.T) {
	// The limit that keeps the next request waiting: one permit, or
	// kv_tokens with room for one request's weight (its max_tokens).
	limits := map[string]string{"permits": `"permits":1,"kv_tokens":100000`, "kv_tokens": `"permits":8,"kv_tokens":1000`}
	for _, store := range []string{"local", "redis"} {
		for _, proto := range []string{"h1", "h2", "h3"} {
			for _, limit := range []string{"permits", "kv_tokens"} {
				if limit == "kv_tokens" && proto != "h2" {
					continue // the count is the protocol's no more than the permit's
				}
				for _, stream := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/%s/%s/stream=%v", store, proto, limit, stream), func(t *testing.T) {
						abortedRunsAloneAtTheUpstream(t, store, proto, limits[limit], stream)
					})
				}
			}
		}
	}
}

func abortedRunsAloneAtTheUpstream(t *testing.T, store, proto, limit string, stream bool) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newStubbornUpstream(t, 400*time.Millisecond)
	name := strings.NewReplacer("/", "-", "=", "-").Replace(t.Name())
	s := runTLSCaddy(t, fmt.Sprintf(
		`{"handler":"fair_queue","name":%q,%s,"max_wait":"60s","abort_grace":"1500ms"%s}`,
		name, limit, storeJSON(t, store)),
		fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, up.dial()))
	c := s.client(t, proto)
	body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":900,"messages":[{"role":"user","content":"hi"}]}`, stream)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	left := chat(ctx, c, s.url, body)
	require.Eventually(t, func() bool { return up.total.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	next := chat(context.Background(), c, s.url, body)
	waitQueueWaiting(t, name, 1)
	cancel()
	got(t, left)
	a := got(t, next)
	assert.Equal(t, http.StatusOK, a.status, a.body)
	assert.Equal(t, int32(2), up.total.Load())
	assert.Equal(t, int32(1), up.most.Load(), "the next request ran beside the aborted one")
}

// A request of a pool whose upstream refused it (429) waits again; its
// client leaves meanwhile: it leaves the queue, reaches no other
// upstream, and holds no permit (the next request is served once the
// busy upstream is free), on each store and over each protocol.
func TestClientThatLeavesWhileRequeuedReachesNoUpstreamOverEachProtocol(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		for _, proto := range []string{"h1", "h2", "h3"} {
			t.Run(store+"/"+proto, func(t *testing.T) {
				t.Cleanup(func() { poolEmpty(t) })
				u1, u2 := newStubbornUpstream(t, 100*time.Millisecond), newStubbornUpstream(t, 100*time.Millisecond)
				name := fmt.Sprintf("requeue-left-%s-%s", store, proto)
				s := runTLSCaddy(t, fmt.Sprintf(
					`{"handler":"fair_queue","name":%q,"max_wait":"60s","kv_tokens":100000,"requeue_on":[429],"upstreams":[{"dial":%q,"permits":1},{"dial":%q,"permits":1}]%s}`,
					name, u1.dial(), u2.dial(), storeJSON(t, store)),
					`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
				c := s.client(t, proto)
				held := chat(context.Background(), c, s.url, `{"model":"m","messages":[{"role":"user","content":"hold"}]}`)
				require.Eventually(t, func() bool { return u1.running.Load()+u2.running.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				left := chat(ctx, c, s.url, `{"model":"m","messages":[{"role":"user","content":"refuse"}]}`)
				require.Eventually(t, func() bool { return u1.total.Load()+u2.total.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
				waitQueueWaiting(t, name, 1) // waits again: one upstream busy, the other cooling
				cancel()
				got(t, left)
				waitQueueWaiting(t, name, 0)
				u1.release <- struct{}{}
				u2.release <- struct{}{}
				_ = got(t, held)
				a := got(t, chat(context.Background(), c, s.url, `{"model":"m","messages":[{"role":"user","content":"x"}]}`))
				assert.Equal(t, http.StatusOK, a.status, a.body)
				assert.Equal(t, int32(3), u1.total.Load()+u2.total.Load(), "the request that left reached no other upstream")
				assert.LessOrEqual(t, u1.most.Load(), int32(1))
				assert.LessOrEqual(t, u2.most.Load(), int32(1))
			})
		}
	}
}

// The same across instances: a request of another instance (a Queue of
// the library on the same Redis queue) waits behind the aborted one, and
// is granted only once the upstream has ended it (within abort_grace).
func TestAbortedRequestTheUpstreamRunsOnNeverRunsBesideAnotherInstancesRequest(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			up := newStubbornUpstream(t, 400*time.Millisecond)
			name := fmt.Sprintf("ignored-cluster-%v", stream)
			s := runTLSCaddy(t, fmt.Sprintf(
				`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","abort_grace":"1500ms","redis":{"addresses":[%q]}}`,
				name, rds.Addr()),
				fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, up.dial()))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			left := chat(ctx, s.client(t, "h2"), s.url,
				fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream))
			require.Eventually(t, func() bool { return up.total.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			rdb := rds.Client(t)
			other, err := fairqueue.New(redisstore.New(rdb, name, redisstore.Options{}),
				fairqueue.Config{Permits: 1, MaxWait: time.Minute})
			require.NoError(t, err)
			t.Cleanup(func() { _ = other.Close() })
			granted := make(chan int32, 1)
			go func() {
				p, err := other.Acquire(context.Background(), fairqueue.Request{})
				if err == nil {
					granted <- up.running.Load()
					p.Release()
				}
			}()
			require.Eventually(t, func() bool {
				n, _ := rdb.ZCard(context.Background(), "{fair_queue:"+name+"}:waiting").Result()
				return n == 1
			}, 10*time.Second, 5*time.Millisecond, "the other instance's request waits")
			cancel()
			got(t, left)
			select {
			case running := <-granted:
				assert.Zero(t, running, "the other instance was granted while the upstream still ran the aborted request (permits 1)")
			case <-time.After(20 * time.Second):
				t.Fatal("the other instance was not granted within 20s")
			}
		})
	}
}
