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

// The bound of a held refusal (heldBound) cuts only an answer held: an
// answer that passes on (a 200) whose header and body come after the
// request's max_wait reaches the client whole, on a pool with
// requeue_on, plain or streamed.
func TestAnAnswerNotHeldIsNeverCutAtMaxWait(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				time.Sleep(1200 * time.Millisecond) // the header after max_wait
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "first ")
				_ = http.NewResponseController(w).Flush()
				time.Sleep(500 * time.Millisecond)
				_, _ = io.WriteString(w, "last")
			}))
			t.Cleanup(upstream.Close)
			url := runCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":"bound-served-%t","upstreams":[{"dial":%q,"permits":1}],
					"requeue_on":[503,429],"max_wait":"1s"}`, stream, strings.TrimPrefix(upstream.URL, "http://")),
				`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
			client := &http.Client{Timeout: 20 * time.Second}
			resp, err := client.Post(url+"/v1/chat/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[],"stream":%t}`, stream)))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "first last", string(body))
		})
	}
}
