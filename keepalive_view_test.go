package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A streaming request that waits in the local queue while Redis is down
// (on_store_error local) moves into the shared queue once Redis is back.
// Its keepalive comments then show its place there, even when it moved
// before its first comment: alone in the shared queue, it is shown
// position=1, not the place it had in the local queue (2, behind a
// request that has left since), which counts no grant any more.
func TestKeepaliveShowsThePlaceInTheQueueTheRequestMovedTo(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	hold := make(chan struct{})
	arrived := make(chan string, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		name := r.Header.Get("X-Name")
		arrived <- name
		if name == "h" {
			<-hold
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { closeOnce(hold) })
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"moved-view","permits":1,"max_wait":"60s","poll_interval":"100ms",
			"sse_keepalive":"5s","on_store_error":"local","local_permits":1,"redis":{"addresses":[%q]}}`, srv.Addr()),
		fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, strings.TrimPrefix(upstream.URL, "http://")))

	post := func(ctx context.Context, name string) <-chan *http.Response {
		ch := make(chan *http.Response, 1)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		require.NoError(t, err)
		req.Header.Set("X-Name", name)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				close(ch)
				return
			}
			t.Cleanup(func() { resp.Body.Close() })
			ch <- resp
		}()
		return ch
	}
	upstreamGot := func(want string) {
		t.Helper()
		select {
		case name := <-arrived:
			require.Equal(t, want, name)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not reach the upstream", want)
		}
	}
	post(context.Background(), "warm") // opens the queue in Redis
	upstreamGot("warm")

	srv.Stop()
	// h runs on the local permit; w0 then w wait in the local queue, w at
	// position 2; w0 leaves.
	post(context.Background(), "h")
	upstreamGot("h")
	ctx, cancel := context.WithCancel(context.Background())
	post(ctx, "w0")
	require.Eventually(t, func() bool { return waitsIn("moved-view") == 1 }, 10*time.Second, 10*time.Millisecond)
	w := post(context.Background(), "w") // its header comes with its first comment
	require.Eventually(t, func() bool { return waitsIn("moved-view") == 2 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.Eventually(t, func() bool { return waitsIn("moved-view") == 1 }, 10*time.Second, 10*time.Millisecond)

	srv.Restart()
	// w moves into the shared queue, where it waits alone behind h.
	require.Eventually(t, func() bool {
		n, err := sharedWaiting("moved-view")
		return err == nil && n == 1
	}, 20*time.Second, 10*time.Millisecond)
	var resp *http.Response
	select {
	case resp = <-w:
		require.NotNil(t, resp)
	case <-time.After(20 * time.Second):
		t.Fatal("no header for w")
	}
	// The first comment may come before the move, on a loaded machine,
	// or while the place in the new queue is not known yet (left out):
	// the comments after it show position 1, where a keepalive that kept
	// the local queue's view would show 2 to the end.
	ev := events(resp.Body)
	var seen []string
	for range 6 {
		e := nextEvent(t, ev)
		if strings.HasPrefix(e, ": queued position=1 ") {
			return
		}
		seen = append(seen, e)
	}
	t.Fatalf("no comment showed position 1 in the shared queue: %q", seen)
}

// waitsIn counts the requests waiting in the queues named name, as their
// handlers count them, whatever the store's state.
func waitsIn(name string) int {
	namesakes.mu.Lock()
	defer namesakes.mu.Unlock()
	n := 0
	for _, e := range namesakes.byName[name] {
		e.waits.mu.Lock()
		n += e.waits.n
		e.waits.mu.Unlock()
	}
	return n
}

// sharedWaiting counts the requests waiting in the store of the queues
// named name.
func sharedWaiting(name string) (int, error) {
	namesakes.mu.Lock()
	list := append([]*engine(nil), namesakes.byName[name]...)
	namesakes.mu.Unlock()
	n := 0
	for _, e := range list {
		snap, err := e.q.Inspect(context.Background(), 0, 0)
		if err != nil {
			return 0, err
		}
		n += snap.Waiting
	}
	return n, nil
}
