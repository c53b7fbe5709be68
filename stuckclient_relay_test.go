package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A committed stream whose upstream fails gets the queue's SSE error
// event; a client that has stopped taking bytes (here over HTTP/2, its
// stream's window left with a few bytes after the keepalive's first
// comment) cannot hold the permit with it: the event is given up within
// the frame bound, as the keepalive's comments and the reject's event
// are, and the permit goes to the next request. Unbounded, the handler
// waited on the client's window for as long as the connection stayed
// open, holding the permit while live requests waited (here past their
// max_wait of 60s: forever).
func TestAnUpstreamErrorEventToAClientThatReadsNothingDoesNotHoldThePermit(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{}, 10)
	bodies := make(chan string, 10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- string(b)
		if strings.Contains(string(b), "fail") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"message":"`+strings.Repeat("x", 2000)+`","type":"server_error"}}`)
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	proxy := `{"handler":"reverse_proxy","upstreams":[{"dial":"` + strings.TrimPrefix(up.URL, "http://") + `"}]}`
	name := "stuck-relay"
	s := runTLSCaddy(t, `{"handler":"fair_queue","name":"`+name+`","permits":1,"max_wait":"60s","sse_keepalive":"2s"}`, proxy)
	c := s.client(t, "h2")
	nextBody := func() string {
		t.Helper()
		select {
		case b := <-bodies:
			return b
		case <-time.After(10 * time.Second):
			t.Fatal("no request reached the upstream within 10s")
			return ""
		}
	}

	first := chat(context.Background(), c, s.url, `{"model":"first"}`)
	require.Equal(t, `{"model":"first"}`, nextBody())

	// 40 bytes of window: the first comment (at most 31 bytes) fits, the
	// error event does not.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
		Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 40},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, s.addr)
		}}
	tr.Protocols.SetHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	header := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"fail","stream":true}`))
		req.Header.Set("Accept", "text/event-stream")
		_, err := tr.RoundTrip(req) // the body is never read
		header <- err
	}()
	select {
	case err := <-header:
		require.NoError(t, err, "the keepalive commits the stream")
	case <-time.After(10 * time.Second):
		t.Fatal("no response header within 10s")
	}

	release <- struct{}{} // first ends; the stuck stream is granted, and its upstream fails
	assert.Equal(t, http.StatusOK, got(t, first).status)
	require.Equal(t, `{"model":"fail","stream":true}`, nextBody())
	next := chat(context.Background(), c, s.url, `{"model":"next"}`)
	require.Equal(t, `{"model":"next"}`, nextBody(), "the stream whose client reads nothing still holds the permit")
	release <- struct{}{}
	a := got(t, next)
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusOK, a.status)
}
