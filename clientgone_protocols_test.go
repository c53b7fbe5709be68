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
)

// heldUpstream is an upstream whose requests run until released (or
// their client leaves); it counts them.
type heldUpstream struct {
	url              string
	release          chan struct{}
	total, run, most atomic.Int32
	bodies           chan string // each request's body, as it arrives
}

func newHeldUpstream(t *testing.T) *heldUpstream {
	t.Helper()
	u := &heldUpstream{release: make(chan struct{}, 100), bodies: make(chan string, 1000)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.bodies <- string(b)
		u.total.Add(1)
		n := u.run.Add(1)
		defer u.run.Add(-1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(u.release) })
	u.url = srv.URL
	return u
}

// nextBody is the body of the next request to reach u.
func (u *heldUpstream) nextBody(t *testing.T) string {
	t.Helper()
	select {
	case b := <-u.bodies:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached the upstream within 10s")
		return ""
	}
}

// proxy is the reverse_proxy handler to u.
func (u *heldUpstream) proxy() string {
	return fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(u.url, "http://"))
}

// queueWaiting is the number of requests waiting in the queue named
// name of this process.
func queueWaiting(t *testing.T, name string) int {
	t.Helper()
	namesakes.mu.Lock()
	list := append([]*engine(nil), namesakes.byName[name]...)
	namesakes.mu.Unlock()
	n := 0
	for _, e := range list {
		snap, err := e.q.Inspect(context.Background(), 0, 0)
		require.NoError(t, err)
		n += snap.Waiting
	}
	return n
}

func waitQueueWaiting(t *testing.T, name string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return queueWaiting(t, name) == n }, 10*time.Second, 5*time.Millisecond,
		"want %d waiting in %s", n, name)
}

// chat starts a chat request on c; its answer (or error) arrives on the
// returned channel.
type answer struct {
	status int
	body   string
	err    error
}

func chat(ctx context.Context, c *http.Client, url, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			ch <- answer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- answer{status: resp.StatusCode, body: string(b), err: err}
	}()
	return ch
}

func got(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer within 20s")
		return answer{}
	}
}

// A client that cancels its waiting request leaves the queue at once,
// over each protocol, and the permit goes to the next live request.
func TestWaiterThatCancelsLeavesTheQueueOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "gone-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy())
			c := s.client(t, proto)

			first := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			ctx, cancel := context.WithCancel(context.Background())
			gone := chat(ctx, c, s.url, `{"model":"m"}`)
			waitQueueWaiting(t, name, 1)
			cancel()
			got(t, gone)
			waitQueueWaiting(t, name, 0)

			last := chat(context.Background(), c, s.url, `{"model":"m"}`)
			waitQueueWaiting(t, name, 1)
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, first).status)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			up.release <- struct{}{}
			a := got(t, last)
			require.NoError(t, a.err)
			assert.Equal(t, http.StatusOK, a.status)
			assert.Equal(t, int32(2), up.total.Load(), "the request whose client left ran upstream")
			assert.Equal(t, int32(1), up.most.Load())
		})
	}
}

// A client whose connection closes while its request waits (HTTP/1.1
// and HTTP/2: the TCP connection; HTTP/3: the QUIC connection) leaves
// the queue at once, and its request never runs upstream.
func TestWaiterWhoseConnectionClosesLeavesTheQueueOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "conn-gone-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy())
			first := chat(context.Background(), s.client(t, proto), s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			c, closeConns := s.closableClient(t, proto)
			gone := chat(context.Background(), c, s.url, `{"model":"gone"}`)
			waitQueueWaiting(t, name, 1)
			closeConns()
			got(t, gone)
			waitQueueWaiting(t, name, 0)
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, first).status)
			last := chat(context.Background(), s.client(t, proto), s.url, `{"model":"last"}`)
			up.nextBody(t) // first's
			assert.Equal(t, `{"model":"last"}`, up.nextBody(t), "the request whose client left ran upstream")
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, last).status)
		})
	}
}

// A client that leaves while its request runs upstream frees the permit
// for the next waiter, over each protocol; the upstream never runs more
// than the permits.
func TestClientThatLeavesWhileRunningFreesThePermitOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "run-gone-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy())
			c := s.client(t, proto)
			ctx, cancel := context.WithCancel(context.Background())
			running := chat(ctx, c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			next := chat(context.Background(), c, s.url, `{"model":"m"}`)
			waitQueueWaiting(t, name, 1)
			cancel()
			got(t, running)
			require.Eventually(t, func() bool { return up.total.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, next).status)
			assert.Equal(t, int32(1), up.most.Load())
		})
	}
}
