package caddyfairqueue

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// staleUpstream is an HTTP/1.1 upstream whose connections each answer
// one request (200, kept alive) and then drop the connection as the
// next request's first byte comes, unread (a reset): a keep-alive
// connection the upstream closed as it went idle, just as reverse_proxy
// wrote the next request on it.
type staleUpstream struct {
	ln      net.Listener
	served  atomic.Int64 // requests answered
	dropped atomic.Int64 // requests dropped on a reused connection
}

func newStaleUpstream(t *testing.T) *staleUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &staleUpstream{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c)
		}
	}()
	return u
}

func (u *staleUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	u.served.Add(1)
	if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"); err != nil {
		return
	}
	if _, err := br.Peek(1); err != nil { // the next request comes on the same connection
		return
	}
	u.dropped.Add(1)
	_ = c.(*net.TCPConn).SetLinger(0) // its bytes unread: a reset
}

// A request sent on a keep-alive connection that the upstream dropped as
// the request came (its keep-alive timeout, uvicorn's 5 s) never reached
// the upstream's application: nothing of it was read. reverse_proxy does
// not send a POST again on a fresh connection (Go's transport retries
// only idempotent requests), and answered 502, which cooled the healthy
// upstream as a failure and passed the 502 on. It is sent again, at its
// place, and the upstream does not cool.
func TestARequestOnAStaleKeepAliveConnectionIsSentAgain(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	u := newStaleUpstream(t)
	const name = "stale-keepalive"
	port := freePort(t)
	dial := u.ln.Addr().String()
	require.NoError(t, caddy.Load([]byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1}],"requeue_on":[503],"max_wait":"20s"},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`,
		port, name, dial)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	cooled := metrics.cooldowns.WithLabelValues(name, dial)
	c0 := testutil.ToFloat64(cooled)

	var codes []int
	for range 3 {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	assert.Positive(t, u.dropped.Load(), "a request was sent on a connection the upstream dropped")
	assert.Equal(t, []int{200, 200, 200}, codes, "every request is served: the upstream read each one it answered")
	assert.Equal(t, int64(3), u.served.Load())
	assert.Equal(t, c0, testutil.ToFloat64(cooled), "the upstream cooled: it answered every request it read")
}
