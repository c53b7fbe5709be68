package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An HTTP/2 client that pauses reading a large answer on one stream
// for more than a second, while another of its streams waits in the
// queue with sse_keepalive, and whose connection's flow-control window
// (shared by its streams) is no larger than what one stream may hold
// unread: the paused answer spends the window, the waiting stream's
// keepalive comment is not taken within a second, and the waiting
// stream is given up (reset, its request cancelled), as a stream whose
// client reads nothing is. A documented limit (hostile-clients.md, "A
// waiting stream whose client reads nothing"): the server cannot tell
// the two apart. The paused stream's answer is whole.
func TestAWaitingStreamBehindASiblingsPausedAnswerIsGivenUpOverHTTP2(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	big := strings.Repeat("x", 1<<20)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "big") {
			_, _ = io.WriteString(w, big)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"ok\":true}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	name := "h2-window-sibling"
	s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","sse_keepalive":"100ms"}`, name),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.URL, "http://")))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
		Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerConnection: 64 << 10},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, s.addr)
		}}
	tr.Protocols.SetHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}

	// The first stream holds the permit; its answer is not read yet.
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"big"}`))
	first, err := c.Do(req)
	require.NoError(t, err)
	defer first.Body.Close()

	// The second waits in the queue, its keepalive behind the window.
	type answer struct {
		status int
		body   string
		err    error
	}
	second := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		req.Header.Set("Accept", "text/event-stream")
		resp, err := c.Do(req)
		if err != nil {
			second <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		second <- answer{status: resp.StatusCode, body: string(b), err: err}
	}()
	waitQueueWaiting(t, name, 1)
	time.Sleep(3 * time.Second) // the client reads the first answer later: a pause of a few seconds

	b, err := io.ReadAll(first.Body)
	require.NoError(t, err)
	require.Len(t, b, len(big))
	select {
	case a := <-second:
		require.Error(t, a.err, "the waiting stream was served: the limit in hostile-clients.md is gone, update it")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting stream got no answer within 30s")
	}
	waitQueueWaiting(t, name, 0)
}
