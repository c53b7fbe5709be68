package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeepaliveETANeverPassesMaxWaitAndOnlyShrinks(t *testing.T) {
	k := &keepalive{maxWait: 10 * time.Second}
	assert.Zero(t, k.bound(0, 0), "unknown stays unknown")
	assert.Zero(t, k.bound(12*time.Second, 0), "beyond max_wait: the request would time out first")
	assert.Zero(t, k.bound(8*time.Second, 5*time.Second), "beyond what max_wait leaves")
	assert.Equal(t, 4*time.Second, k.bound(4*time.Second, 5*time.Second))
	assert.LessOrEqual(t, k.bound(5*time.Second, 5*time.Second), 4*time.Second, "a slower rate does not make it grow")
	assert.Equal(t, 2*time.Second, k.bound(2*time.Second, 5*time.Second), "a faster one makes it shrink")

	k.shownAt = k.shownAt.Add(-1500 * time.Millisecond) // 1.5 s later, not served yet
	assert.Zero(t, k.bound(2*time.Second, 6500*time.Millisecond), "the countdown ran out: no estimate, rather than one stuck at 1 s")
	assert.Zero(t, k.bound(time.Second, 6500*time.Millisecond), "nor any later in this wait")
}

var etaComment = regexp.MustCompile(`^: queued position=\d+ eta=(\d+)s waited=(\d+)s$`)

// TestKeepaliveETAsAClientSeesAreSound queues a dozen streaming clients
// behind one permit and answers of 400 ms, with max_wait 3s: the ones at
// the back cannot be served in time. Every estimate a client is shown
// fits in what max_wait leaves it, and none grows while it waits.
func TestKeepaliveETAsAClientSeesAreSound(t *testing.T) {
	const maxWait = 3 * time.Second
	h := keepaliveHandler(t, "eta", &Handler{MaxWait: caddy.Duration(maxWait), PollInterval: caddy.Duration(100 * time.Millisecond)})
	upstream := proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(400 * time.Millisecond)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	srv := serve(t, h, upstream)
	var mu sync.Mutex
	shown := 0
	var wg sync.WaitGroup
	for round := range 3 {
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp := srv.post(t, context.Background(), `{"stream":true}`)
				last := -1
				for block := range events(resp.Body) {
					m := etaComment.FindStringSubmatch(block)
					if m == nil {
						continue
					}
					eta, _ := strconv.Atoi(m[1])
					waited, _ := strconv.Atoi(m[2])
					// eta is rounded up, waited down: one second of slack.
					assert.LessOrEqual(t, eta+waited, int(maxWait/time.Second)+1, "round %d client %d: %q", round, i, block)
					if last >= 0 {
						assert.LessOrEqual(t, eta, last, "round %d client %d: the estimate grew", round, i)
					}
					last = eta
					mu.Lock()
					shown++
					mu.Unlock()
				}
			}()
			time.Sleep(10 * time.Millisecond)
		}
		wg.Wait()
	}
	require.Positive(t, shown, "some estimate was shown (the rate was learned)")
}
