package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// lateRefuser answers a request with X-Refuse 429 once refuse is
// closed, one with X-Quick 200 at once, and any other one 200 once
// release is closed, counting the requests it runs at once.
type lateRefuser struct {
	srv             *httptest.Server
	refuse, release chan struct{}
	refusing        atomic.Int64 // requests with X-Refuse in
	lastRefusing    atomic.Int64 // when the last of them came in (UnixNano)
	now, most       atomic.Int64
	once            sync.Once
}

func newLateRefuser(t *testing.T) *lateRefuser {
	t.Helper()
	u := &lateRefuser{refuse: make(chan struct{}), release: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := u.now.Add(1)
		defer u.now.Add(-1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		if r.Header.Get("X-Quick") != "" {
			w.WriteHeader(http.StatusOK)
			return
		}
		if r.Header.Get("X-Refuse") != "" {
			u.lastRefusing.Store(time.Now().UnixNano())
			u.refusing.Add(1)
			<-u.refuse
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":{"message":"busy upstream"}}`))
			return
		}
		<-u.release
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(u.srv.Close)
	t.Cleanup(u.open)
	return u
}

func (u *lateRefuser) open() {
	u.once.Do(func() {
		close(u.release)
		select {
		case <-u.refuse:
		default:
			close(u.refuse)
		}
	})
}

// A request whose upstream refuses it (requeue_on) after its max_wait
// has passed gets the timeout reject: its requeue call cannot wait, and
// that is the request's deadline, not Redis failing. Counted as a store
// failure, two such requeues at once marked a healthy Redis down
// (on_store_error fail_open: requests admitted past every permit until
// the next store call succeeded), and each one counted in
// store_errors_total and asked for a heartbeat out of turn.
func TestRequeuePastMaxWaitIsNotAStoreFailure(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	u := newLateRefuser(t)
	const name = "requeue-late"
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":2}],"requeue_on":[429],"upstream_cooldown":"1ms",
		 "max_wait":"500ms","poll_interval":"50ms","redis":{"addresses":[%q]}},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`,
		port, name, strings.TrimPrefix(u.srv.URL, "http://"), rds.Addr())), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	errs := metrics.storeErrors.WithLabelValues(name)
	e0 := testutil.ToFloat64(errs)

	type answer struct {
		code int
		body string
	}
	send := func(kind string, out chan<- answer) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m","messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		if kind != "" {
			req.Header.Set(kind, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- answer{resp.StatusCode, string(b)}
	}

	// The instance joins its queue first, with requests answered at once
	// until one is granted: the first request waits for the join, which
	// may take longer than the max_wait below on a loaded machine (it is
	// bounded by the store's timeout, 1s), and the two below would be
	// rejected before reaching the upstream.
	require.Eventually(t, func() bool {
		warm := make(chan answer, 1)
		send("X-Quick", warm)
		return (<-warm).code == http.StatusOK
	}, 30*time.Second, 10*time.Millisecond, "never joined")

	// Two requests run on the upstream, which refuses them only once
	// their max_wait (500ms from their arrival, which is before the
	// upstream saw them) has passed.
	refused := make(chan answer, 2)
	for range 2 {
		go send("X-Refuse", refused)
	}
	require.Eventually(t, func() bool { return u.refusing.Load() == 2 }, 30*time.Second, 5*time.Millisecond)
	time.Sleep(time.Until(time.Unix(0, u.lastRefusing.Load()).Add(500*time.Millisecond + 100*time.Millisecond))) // past their max_wait: a deadline, not a speed
	close(u.refuse)
	for range 2 {
		select {
		case a := <-refused:
			assert.Equal(t, http.StatusTooManyRequests, a.code, "%s", a.body)
			assert.Contains(t, a.body, `"timeout"`, "the timeout reject, not the upstream's refusal: %s", a.body)
		case <-time.After(30 * time.Second):
			t.Fatal("no answer")
		}
	}

	// Redis answered every call it was sent: no store error, and the
	// queue's permits still hold for the requests that come now.
	assert.Equal(t, e0, testutil.ToFloat64(errs), "store errors counted for requeues past max_wait")
	served := make(chan answer, 3)
	for range 3 {
		go send("", served)
	}
	rdb := rds.Client(t)
	require.Eventually(t, func() bool {
		n, _ := rdb.ZCard(context.Background(), "{fair_queue:"+name+"}:waiting").Result()
		// The third waits, or has already waited its max_wait out (a
		// loaded machine may take longer than that to start the two).
		// The refused requests' permits, given back in the background
		// as their upstream cools (1ms), are handed on by the next poll
		// once it ended (50ms), not by their release: these three may
		// queue first.
		return u.most.Load() > 2 || (u.now.Load() == 2 && (n == 1 || len(served) == 1))
	}, 30*time.Second, 2*time.Millisecond, "two run, one waits")
	u.open()
	for range 3 {
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			t.Fatal("no answer")
		}
	}
	assert.LessOrEqual(t, u.most.Load(), int64(2), "the upstream of 2 permits ran more at once")
}
