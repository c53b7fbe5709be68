package caddyfairqueue

import (
	"compress/gzip"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// gzipped answers with next's answer gzip-compressed when the request
// accepts gzip, as a backend behind nginx's gzip or Caddy's encode does.
func gzipped(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		next.ServeHTTP(gzipWriter{w, gz}, r)
	})
}

type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func (g gzipWriter) WriteHeader(code int) {
	g.Header().Del("Content-Length")
	g.ResponseWriter.WriteHeader(code)
}

func (g gzipWriter) Write(b []byte) (int, error) { return g.gz.Write(b) }

func (g gzipWriter) Flush() {
	_ = g.gz.Flush()
	g.ResponseWriter.(http.Flusher).Flush()
}

// TestWaitedStreamGetsACompressingUpstreamsAnswerDecoded: once
// sse_keepalive has sent a waiting stream's header (no Content-Encoding),
// the upstream's answer must reach the client as the client can read it,
// although the client accepts gzip (every HTTP library says so) and the
// upstream compresses what it may.
func TestWaitedStreamGetsACompressingUpstreamsAnswerDecoded(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "gzip-relay", &Handler{})
	mock := mockllm.New(mockllm.Config{Tokens: 2, Delay: time.Millisecond}).Handler()
	srv := serve(t, h, proxyTo(t, gzipped(mock)))
	release := holdPermit(t, h)
	go func() {
		time.Sleep(350 * time.Millisecond)
		release()
	}()

	resp := srv.postPath(t, "/api/generate", `{"model":"llama3","prompt":"hi"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Content-Encoding"), "the header went out before the upstream answered")
	lines := ndjson(t, resp.Body)
	require.GreaterOrEqual(t, len(lines), 4, "waiting chunks, two tokens and the last line")
	text := ""
	for _, l := range lines {
		text += l["response"].(string)
	}
	assert.Equal(t, "tok tok ", text)
	assert.Equal(t, true, lines[len(lines)-1]["done"])
	assert.Equal(t, "granted", srv.outcome(t))
}
