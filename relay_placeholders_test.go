package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stream whose header sse_keepalive sent while it waited goes on to
// the handlers after fair_queue as any other request does: a request
// header one of them sets is read by the placeholders of the next (here
// reverse_proxy's header_up), which read the request in place.
func TestAWaitedStreamsHeadersReachThePlaceholdersOfTheHandlersAfter(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{})
	var mu sync.Mutex
	var seen []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Seen"))
		first := len(seen) == 1
		mu.Unlock()
		if first {
			<-release
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(upstream.Close)
	name := "relay-placeholders"
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","sse_keepalive":"100ms"}`, name),
		`{"handler":"headers","request":{"set":{"X-Tag":["pool"]}}}`,
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}],"headers":{"request":{"set":{"X-Seen":["{http.request.header.X-Tag}"]}}}}`,
			strings.TrimPrefix(upstream.URL, "http://")))

	stream := func() <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true}`))
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := http.DefaultClient.Do(req)
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
	first := stream()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 1 }, 10*time.Second, 5*time.Millisecond)
	second := stream()
	waitQueueWaiting(t, name, 1)
	time.Sleep(500 * time.Millisecond) // its keepalive sends the header
	close(release)
	for _, ch := range []<-chan answer{first, second} {
		a := got(t, ch)
		require.NoError(t, a.err)
		assert.Contains(t, a.body, "[DONE]")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"pool", "pool"}, seen, "X-Seen, from {http.request.header.X-Tag}, at the upstream")
}
