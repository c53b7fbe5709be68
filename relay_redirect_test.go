package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// redirectUpstream answers every request with a redirect and a page
// that says so, as an http:// upstream that sends its clients to
// https:// does.
func redirectUpstream(t *testing.T) caddyhttp.Handler {
	t.Helper()
	return proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "https://llm.internal"+r.URL.Path)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusPermanentRedirect)
		_, _ = io.WriteString(w, "<html><body>308 Permanent Redirect</body></html>\n")
	}))
}

// An upstream that answers a committed stream with a redirect: the
// client cannot follow it (the 200 went out with the first keepalive
// comment), so it must get an error on the stream, not a stream that
// ends empty as if answered (the OpenAI SDKs and the AI SDK end such a
// stream cleanly, with no chunk and no error).
func TestKeepaliveTurnsAnUpstreamRedirectIntoAnErrorOnTheStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const msg = "The upstream server answered with status 308 Permanent Redirect."

	t.Run("event stream", func(t *testing.T) {
		h := keepaliveHandler(t, "ka-upstream-redirect", &Handler{})
		srv := serve(t, h, redirectUpstream(t))
		release := holdPermit(t, h)
		resp := srv.post(t, context.Background(), `{"stream":true}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// The header came with the first comment: the request waits;
		// then its permit comes.
		release()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.NotContains(t, string(body), "<html>", "the redirect's page is not relayed as the stream")
		blocks := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
		assert.Regexp(t, `^: queued`, blocks[0])
		assert.Equal(t, `event: error
data: {"error":{"message":"`+msg+`","type":"server_error","code":"upstream_error"}}`, blocks[len(blocks)-1],
			"the stream ends with the error event")
		assert.Equal(t, "granted", srv.outcome(t))
	})

	t.Run("ollama", func(t *testing.T) {
		h := keepaliveHandler(t, "ollama-upstream-redirect", &Handler{})
		srv := serve(t, h, redirectUpstream(t))
		release := holdPermit(t, h)
		resp := srv.postPath(t, "/api/chat", `{"model":"m","messages":[]}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// The first waiting chunk is in once the header is: the request
		// waits; then its permit comes.
		release()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		lines := ndjson(t, strings.NewReader(string(body)))
		require.NotEmpty(t, lines)
		assert.Equal(t, map[string]any{"error": msg}, lines[len(lines)-1], "Ollama's clients throw on a line with an error")
		assert.Equal(t, "granted", srv.outcome(t))
	})
}
