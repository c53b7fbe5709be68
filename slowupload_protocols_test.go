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

// trickle sends a chat request on c that declares a body of 1,000 bytes,
// sends its first 12 and then a byte every 100ms until the answer comes;
// the answer's status (or the error) arrives on the returned channel.
func trickle(c *http.Client, url string) <-chan answer {
	ch := make(chan answer, 1)
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	go func() {
		defer pw.Close()
		if _, err := io.WriteString(pw, `{"model":"m"`); err != nil {
			return
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := io.WriteString(pw, " "); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		defer close(stop)
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", pr)
		req.ContentLength = 1000
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

// Bodies sent a byte at a time, many on one connection (HTTP/2 and
// HTTP/3 streams), hold no place in the queue while they arrive: with
// max_queue 1 a real request still waits in it, and is served; each
// trickling body is answered 408 once body_timeout has passed, however
// it keeps trickling.
func TestTricklingBodiesHoldNoQueueSlotAndAreAnsweredOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "trickle-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_queue":1,"max_wait":"60s","body_timeout":"1s"}`, name), up.proxy())
			c := s.client(t, proto)
			running := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			var slow []<-chan answer
			for range 8 {
				slow = append(slow, trickle(c, s.url))
			}
			waiting := chat(context.Background(), c, s.url, `{"model":"real"}`)
			waitQueueWaiting(t, name, 1)
			for _, ch := range slow {
				a := got(t, ch)
				if proto != "h1" {
					require.NoError(t, a.err)
				}
				if a.err == nil { // HTTP/1 may see the connection closed first
					assert.Equal(t, http.StatusRequestTimeout, a.status, a.body)
					assert.True(t, strings.Contains(a.body, "request_timeout"), a.body)
				}
			}
			assert.Equal(t, 1, queueWaiting(t, name))
			up.release <- struct{}{}
			up.release <- struct{}{}
			for _, ch := range []<-chan answer{running, waiting} {
				a := got(t, ch)
				require.NoError(t, a.err)
				assert.Equal(t, http.StatusOK, a.status)
			}
			assert.Equal(t, int32(2), up.total.Load(), "a trickling body reached the upstream")
		})
	}
}
