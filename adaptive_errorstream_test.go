package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An error answer is not timed (AdaptiveConfig.TargetTTFT), however long
// it took: a stream the upstream answered with an error status had no
// first token to wait for, and is no stream whose first token never
// came (ObserveUnanswered). That holds for an error with an empty body,
// and for one on a stream the keepalive committed while it waited,
// whose error body becomes the queue's error event (beneath the writer
// that times the answer): neither may count as a TTFT above the target.
func TestAdaptiveDoesNotTimeAStreamAnsweredWithAnError(t *testing.T) {
	for _, tc := range []struct {
		name      string
		committed bool   // the keepalive commits the stream while it waits
		body      string // the error answer's body
	}{
		{"an error with an empty body", false, ""},
		{"an error on a committed stream", true, `{"error":{"message":"boom"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			holding := make(chan struct{}, 2)
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.Header.Get("X-Hold") != "" { // a stream whose first token comes at once, holding the permit a while
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: {}\n\n")
					_ = http.NewResponseController(w).Flush()
					holding <- struct{}{}
					time.Sleep(600 * time.Millisecond)
					return
				}
				time.Sleep(400 * time.Millisecond) // 4 times the target
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", fmt.Sprint(len(tc.body)))
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, tc.body)
			}))
			t.Cleanup(upstream.Close)
			name := "adapt-errorstream-" + strings.ReplaceAll(tc.name, " ", "-")
			url := runCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"sse_keepalive":"200ms",
				 "adaptive":{"target_ttft":"100ms","min_samples":1,"interval":"100ms","decrease":0.5}}`, name),
				fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, strings.TrimPrefix(upstream.URL, "http://")))
			client := &http.Client{Timeout: 20 * time.Second}
			post := func(hold bool) (int, string) {
				req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				if hold {
					req.Header.Set("X-Hold", "1")
				}
				resp, err := client.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}

			if tc.committed { // the stream waits behind another, and the keepalive commits it
				go post(true)
				<-holding
			}
			status, body := post(false)
			if tc.committed {
				require.Equal(t, http.StatusOK, status, "%s", body)
				require.Contains(t, body, "event: error", "the upstream's error, as an event of the committed stream")
			} else {
				require.Equal(t, http.StatusInternalServerError, status, "%s", body)
			}
			// Whatever the error's answer counted is reported by now: the
			// next report goes with this quick stream's first token, past
			// the interval.
			time.Sleep(300 * time.Millisecond)
			post(true)
			time.Sleep(300 * time.Millisecond)
			assert.Equal(t, 1.0, learnedShare(t, name),
				"an upstream answered a stream with an error status after 400 ms (target 100 ms), and the learned share moved down")
		})
	}
}

// On a stream the keepalive committed while it waited, next's failure is
// noted as the answer's status (relayEnd): reverse_proxy giving up on a
// first token that never came (response_header_timeout, a 504), or the
// client leaving (a 499), is no error the upstream answered, and counts
// as a TTFT above the target as on a stream not committed.
func TestAdaptiveCountsACommittedStreamWhoseFirstTokenNeverCame(t *testing.T) {
	for _, tc := range []struct {
		name         string
		proxyTimeout string // reverse_proxy's response_header_timeout ("": none, the client leaves)
	}{
		{"reverse_proxy gives up waiting for the header", "400ms"},
		{"the client leaves", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			holding := make(chan struct{}, 1)
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.Header.Get("X-Hold") != "" { // a quick first token, holding the permit a while
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: {}\n\n")
					_ = http.NewResponseController(w).Flush()
					holding <- struct{}{}
					time.Sleep(600 * time.Millisecond)
					return
				}
				select { // the first token never comes
				case <-r.Context().Done():
				case <-time.After(30 * time.Second):
				}
			}))
			t.Cleanup(upstream.Close)
			transport := ""
			if tc.proxyTimeout != "" {
				transport = fmt.Sprintf(`"transport":{"protocol":"http","response_header_timeout":%q},`, tc.proxyTimeout)
			}
			name := "adapt-committed-nofirstbyte-" + strings.ReplaceAll(tc.name, " ", "-")
			url := runCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"sse_keepalive":"200ms",
				 "adaptive":{"target_ttft":"100ms","min_samples":1,"interval":"100ms","decrease":0.5}}`, name),
				fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,%s"upstreams":[{"dial":%q}]}`,
					transport, strings.TrimPrefix(upstream.URL, "http://")))
			go func() {
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				req.Header.Set("X-Hold", "1")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}()
			<-holding
			client := &http.Client{Timeout: 20 * time.Second}
			if tc.proxyTimeout == "" {
				client.Timeout = 1500 * time.Millisecond // the stream is committed at 200 ms, forwarded at 600 ms
			}
			req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := client.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if tc.proxyTimeout != "" {
					require.Contains(t, string(b), "event: error", "reverse_proxy's timeout, as an event of the committed stream")
				}
			}
			assert.Eventually(t, func() bool { return learnedShare(t, name) < 1 }, 5*time.Second, 20*time.Millisecond,
				"a committed stream waited 400 ms or more for a first token that never came (target 100 ms), and the learned share stays at %v",
				learnedShare(t, name))
		})
	}
}
