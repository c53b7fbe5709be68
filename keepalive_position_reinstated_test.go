package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Waiters queued before Redis restarts empty are queued again by their
// instance once it is back (at the tail, in their order). The places
// they are shown meanwhile count from the new data set's grant counter,
// not from the old one's: two waiters behind one running request stay
// at positions 1 and 2, not 31 and 32 once the counter starts over
// below the 30 grants made before the restart.
func TestKeepalivePositionsOfWaitersQueuedAgainAfterRedisRestartsEmpty(t *testing.T) {
	srv := redistest.Start(t)
	dial, hold, holding := holdingUpstream(t)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"reinstated-positions","permits":1,"max_wait":"60s",
			"lease":"3s","poll_interval":"100ms","sse_keepalive":"100ms","on_store_error":"fail_closed","redis":{"addresses":[%q]}}`, srv.Addr()),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, dial))

	post := func(hold bool) *http.Response {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		require.NoError(t, err)
		if hold {
			req.Header.Set("X-Hold", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for i := range 30 { // the counter reaches 30 before the restart
		resp := post(false)
		body, _ := io.ReadAll(resp.Body)
		require.Contains(t, string(body), "[DONE]", "request %d", i)
	}

	post(true)
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the holding request did not reach the upstream")
	}

	// Two waiters, each queued (its first comment seen) before the next;
	// every place each is shown is kept, in order.
	var mu sync.Mutex
	shown := make([][]string, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		ch := events(post(false).Body)
		first := nextEvent(t, ch)
		require.Regexp(t, positionComment, first, "waiter %d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for block := range ch {
				mu.Lock()
				shown[i] = append(shown[i], block)
				mu.Unlock()
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return min(len(shown[0]), len(shown[1]))
	}
	require.Eventually(t, func() bool { return count() >= 5 }, 30*time.Second, 50*time.Millisecond)

	srv.Restart()
	// Let the instance see the new data set and queue its waiters again,
	// then show them their places for a while.
	before := count()
	require.Eventually(t, func() bool { return count() >= before+40 }, 30*time.Second, 50*time.Millisecond)
	closeOnce(hold)
	wg.Wait()

	for i, blocks := range shown {
		farthest, at := 0, ""
		for _, b := range blocks {
			if m := positionComment.FindStringSubmatch(b); m != nil {
				if n, _ := strconv.Atoi(m[1]); n > farthest {
					farthest, at = n, b
				}
			}
		}
		assert.Equal(t, i+1, farthest, "waiter %d's farthest place shown: %q", i+1, at)
		t.Logf("waiter %d: %q", i+1, blocks[:min(len(blocks), 12)])
	}
}
