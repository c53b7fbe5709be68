package caddyfairqueue

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With Caddy's write_timeout (write_idle_timeout off), a long streamed
// answer is cut at the write timeout, counted from the request's start,
// as reverse_proxy alone cuts it: also after the queue's keepalive
// comments fed it while it waited, over HTTP/1 and HTTP/2 (HTTP/3 has
// no write deadline of the server's without write_idle_timeout).
func TestAWriteTimeoutCutsALongStreamAfterKeepalivesAsWithoutTheQueue(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		for _, queue := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/queue=%v", proto, queue), func(t *testing.T) {
				t.Cleanup(func() { poolEmpty(t) })
				var blocked atomic.Int32
				release, done := make(chan struct{}), make(chan struct{})
				up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, _ := io.ReadAll(r.Body)
					if strings.Contains(string(b), `"block"`) {
						blocked.Add(1)
						select {
						case <-release:
						case <-r.Context().Done():
						}
						return
					}
					w.Header().Set("Content-Type", "text/event-stream")
					for r.Context().Err() == nil { // endless, unless cut
						if _, err := w.Write([]byte("data: tick\n\n")); err != nil {
							return
						}
						w.(http.Flusher).Flush()
						select {
						case <-time.After(50 * time.Millisecond):
						case <-done: // the test has ended
							return
						}
					}
				}))
				t.Cleanup(up.Close)
				t.Cleanup(func() { close(done) })
				proxy := fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.URL, "http://"))
				name := "write-timeout-stream-" + proto
				handlers := []string{proxy}
				if queue {
					handlers = []string{fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"120s","sse_keepalive":"100ms"}`, name), proxy}
				}
				s := runTLSCaddyWith(t, `"write_idle_timeout":-1,"write_timeout":"2s",`, handlers...)
				var blocker <-chan answer
				if queue {
					// A request holds the permit while the stream waits,
					// fed keepalive comments.
					blocker = chat(context.Background(), s.client(t, "h2"), s.url, `{"model":"block"}`)
					require.Eventually(t, func() bool { return blocked.Load() == 1 }, 30*time.Second, 5*time.Millisecond)
				}
				ended := make(chan error, 1)
				go func() {
					req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"long","stream":true}`))
					req.Header.Set("Accept", "text/event-stream")
					resp, err := s.client(t, proto).Do(req)
					if err != nil {
						ended <- err
						return
					}
					defer resp.Body.Close()
					br := bufio.NewReader(resp.Body)
					for {
						if _, err := br.ReadString('\n'); err != nil {
							ended <- err
							return
						}
					}
				}()
				if queue {
					waitQueueWaiting(t, name, 1)
					time.Sleep(500 * time.Millisecond) // keepalive comments
					close(release)
					require.NoError(t, got(t, blocker).err)
				}
				select {
				case <-ended: // cut: an error or the end of the body
				case <-time.After(60 * time.Second):
					t.Fatal("the stream ran on past the write timeout")
				}
			})
		}
	}
}
