package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openStream sends a streamed chat request on c and returns its
// response once the header is in.
func openStream(t *testing.T, ctx context.Context, c *http.Client, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A waiting streamed request's keepalive comments reach the client over
// each protocol while it waits (not buffered until it ends), and its
// reject at max_wait arrives as an SSE error event.
func TestWaitingStreamIsFedAndRejectedOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "fed-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"1s","sse_keepalive":"100ms"}`, name), up.proxy())
			c := s.client(t, proto)
			first := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			resp := openStream(t, context.Background(), c, s.url)
			assert.Equal(t, proto[1:], fmt.Sprint(resp.ProtoMajor))
			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			ch := events(resp.Body)
			e := nextEvent(t, ch)
			assert.True(t, strings.HasPrefix(e, ": queued"), e)
			assert.Equal(t, 1, queueWaiting(t, name), "the comment came while the request waited")
			blocks := rest(t, ch)
			require.NotEmpty(t, blocks)
			assert.True(t, strings.HasPrefix(blocks[len(blocks)-1], "event: error\ndata: "), blocks[len(blocks)-1])
			assert.Contains(t, blocks[len(blocks)-1], `"timeout"`)
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, first).status)
		})
	}
}
