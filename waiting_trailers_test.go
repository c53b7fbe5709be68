package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chatWithTrailers starts a chat request on c whose body is followed by
// trailer fields of about size bytes in all; its answer arrives on the
// returned channel.
func chatWithTrailers(c *http.Client, url string, size int) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", io.MultiReader(strings.NewReader(`{"model":"m"}`)))
		if err != nil {
			ch <- answer{err: err}
			return
		}
		req.ContentLength = -1
		req.Header.Set("Content-Type", "application/json")
		req.Trailer = http.Header{}
		pad := strings.Repeat("t", 4096)
		for i := range size / len(pad) {
			req.Trailer.Set(fmt.Sprintf("X-Pad-%d", i), pad)
		}
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

// A waiting request's trailer fields (sent after its body, up to the
// server's max_header_bytes over HTTP/2 and HTTP/3) count against
// max_waiting_bytes with its headers: they stay in memory with the
// request while it waits. Uncounted, a request of an empty body and a
// MiB of trailers counted a few hundred bytes, so that a thousand such
// waiters held a GiB that max_waiting_bytes did not see.
func TestWaitingTrailersCountAgainstMaxWaitingBytesOverHTTP2AndHTTP3(t *testing.T) {
	for _, proto := range []string{"h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "trailers-" + proto
			s := runTLSCaddyWith(t, `"max_header_bytes":1048576,`, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_body":1000,"max_waiting_bytes":100000,"max_wait":"30s"}`, name), up.proxy())
			c := s.client(t, proto)
			running := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			a := chatWithTrailers(c, s.url, 64<<10)
			if !assert.Eventually(t, func() bool { return queueWaiting(t, name) == 1 }, 5*time.Second, 5*time.Millisecond) {
				up.release <- struct{}{}
				ans := got(t, a)
				t.Fatalf("a: %d %q %v", ans.status, ans.body, ans.err)
			}
			assert.Greater(t, waitingBytes.Load(), int64(64<<10), "a's trailers are not counted")

			// b's trailers would take what waits beyond 100,000 bytes.
			b := chatWithTrailers(c, s.url, 64<<10)
			var bAnswer answer
			select {
			case bAnswer = <-b:
			case <-time.After(10 * time.Second):
				up.release <- struct{}{}
				up.release <- struct{}{}
				up.release <- struct{}{}
				t.Fatalf("b waits with a: %d requests waiting, %d bytes counted", queueWaiting(t, name), waitingBytes.Load())
			}
			require.NoError(t, bAnswer.err)
			assert.Equal(t, http.StatusTooManyRequests, bAnswer.status, bAnswer.body)
			assert.Contains(t, bAnswer.body, "queue_full")

			up.release <- struct{}{}
			up.release <- struct{}{}
			ans := got(t, running)
			require.NoError(t, ans.err)
			assert.Equal(t, http.StatusOK, ans.status, ans.body)
			// a is granted and forwarded; its answer may be a 502: the test
			// upstream (HTTP/1) takes 4 KiB of trailers, not 64.
			require.NoError(t, got(t, a).err)
			require.Eventually(t, func() bool { return waitingBytes.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "bytes left counted")
		})
	}
}
