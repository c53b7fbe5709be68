package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var positionComment = regexp.MustCompile(`^: queued position=(\d+) `)

// holdingUpstream is an SSE upstream that holds each request with an
// X-Hold header (telling holding as it runs) until hold is closed (by
// the test's end at the latest), and answers the others at once.
func holdingUpstream(t *testing.T) (dial string, hold chan struct{}, holding <-chan struct{}) {
	t.Helper()
	hold = make(chan struct{})
	held := make(chan struct{}, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get("X-Hold") != "" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			held <- struct{}{}
			<-hold
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { closeOnce(hold) })
	return strings.TrimPrefix(upstream.URL, "http://"), hold, held
}

// After Redis restarts empty, the queue's grant counter starts over.
// The positions streaming waiters are shown (and the Retry-After a
// reject estimates from them) are counted from it: three waiters behind
// one running request are at positions 1, 2 and 3, not all at 1 until
// the new counter passes the grants made before the restart.
func TestKeepalivePositionsAfterRedisRestartsEmpty(t *testing.T) {
	srv := redistest.Start(t)
	dial, hold, holding := holdingUpstream(t)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"restart-positions","permits":1,"max_wait":"60s",
			"lease":"3s","poll_interval":"100ms","sse_keepalive":"100ms","on_store_error":"fail_closed","redis":{"addresses":[%q]}}`, srv.Addr()),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, dial))

	post := func(hold bool) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		require.NoError(t, err)
		if hold {
			req.Header.Set("X-Hold", "1")
		}
		return http.DefaultClient.Do(req)
	}
	served := func() bool {
		resp, err := post(false)
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), "[DONE]")
	}

	for i := range 30 { // the counter reaches 30 before the restart
		require.True(t, served(), "request %d", i)
	}
	srv.Restart()
	// fail_closed: served once Redis grants again (fail_open would admit
	// the holder below without a permit while the instance still counts
	// Redis down, and the waiters would run at once).
	require.Eventually(t, served, 30*time.Second, 100*time.Millisecond, "served again after the restart")

	holder, err := post(true)
	require.NoError(t, err)
	defer holder.Body.Close()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the holding request did not reach the upstream")
	}

	// Three waiters, each queued (its first comment seen) before the next.
	var mu sync.Mutex
	last := make([]int, 3)
	seen := make([]int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		resp, err := post(false)
		require.NoError(t, err)
		defer resp.Body.Close()
		ch := events(resp.Body)
		first := nextEvent(t, ch)
		require.Regexp(t, positionComment, first, "waiter %d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for block := range ch {
				if m := positionComment.FindStringSubmatch(block); m != nil {
					n, _ := strconv.Atoi(m[1])
					mu.Lock()
					last[i], seen[i] = n, seen[i]+1
					mu.Unlock()
				}
			}
		}()
	}
	// Let every waiter be shown its place several times (reconciles run
	// meanwhile), then take the last place each was shown.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return min(seen[0], seen[1], seen[2]) >= 10
	}, 30*time.Second, 50*time.Millisecond)
	mu.Lock()
	got := append([]int(nil), last...)
	mu.Unlock()
	closeOnce(hold)
	wg.Wait()
	assert.Equal(t, []int{1, 2, 3}, got, "the places the three waiters were shown")
}
