package caddyfairqueue

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An HTTP/1 client that sends the first byte of a next (pipelined)
// request while its request waits, then closes its connection, leaves
// the queue at once like any client that leaves, and is never
// forwarded: Go's server stops watching a connection for its close once
// a pipelined byte arrives. Over plain TCP, TLS, behind proxy_protocol,
// and on a server of HTTP/1 alone (Caddy wraps its connections then).
func TestAWaiterThatPipelinesAByteAndLeavesLeavesTheQueueOverHTTP1(t *testing.T) {
	for _, tc := range []string{"plain", "tls", "proxy_protocol", "h1 alone"} {
		t.Run(tc, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "pipeline-gone-" + tc
			handlers := []string{fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy()}
			var url string
			var client *http.Client
			var dial func() (net.Conn, error)
			switch tc {
			case "plain":
				url, client = runCaddy(t, handlers...), http.DefaultClient
				dial = func() (net.Conn, error) { return net.Dial("tcp", strings.TrimPrefix(url, "http://")) }
			case "h1 alone":
				url, client = runCaddyWith(t, `"protocols":["h1"],`, handlers...), http.DefaultClient
				dial = func() (net.Conn, error) { return net.Dial("tcp", strings.TrimPrefix(url, "http://")) }
			case "proxy_protocol":
				url = runCaddyWith(t, `"listener_wrappers":[{"wrapper":"proxy_protocol","allow":["127.0.0.1/32"]}],`, handlers...)
				addr := strings.TrimPrefix(url, "http://")
				dial = func() (net.Conn, error) {
					c, err := net.Dial("tcp", addr)
					if err == nil {
						_, err = io.WriteString(c, "PROXY TCP4 192.0.2.1 127.0.0.1 1234 80\r\n")
					}
					return c, err
				}
				client = &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return dial() }}}
			default:
				s := runTLSCaddy(t, handlers...)
				url, client = s.url, s.client(t, "h1")
				dial = func() (net.Conn, error) {
					return tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.roots, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
				}
			}
			first := chat(context.Background(), client, url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			conn, err := dial()
			require.NoError(t, err)
			body := `{"model":"gone"}`
			_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+
				"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			require.NoError(t, err)
			waitQueueWaiting(t, name, 1)     // its body is read: the server watches the connection
			_, err = conn.Write([]byte("P")) // a pipelined request starts
			require.NoError(t, err)
			time.Sleep(100 * time.Millisecond) // the byte arrives on its own
			require.NoError(t, conn.Close())

			require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 10*time.Second, 5*time.Millisecond,
				"a client that pipelined a byte and left still waits in the queue")
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, first).status)
			last := chat(context.Background(), client, url, `{"model":"last"}`)
			require.Eventually(t, func() bool { return up.total.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
			up.release <- struct{}{}
			assert.Equal(t, http.StatusOK, got(t, last).status)
			assert.Equal(t, []string{`{"model":"m"}`, `{"model":"last"}`}, []string{up.nextBody(t), up.nextBody(t)},
				"the request of a client that left reached the upstream")
		})
	}
}

// Granted and running, such a client is seen leaving too: its request
// is cancelled towards the upstream, as any client's that leaves, and
// the permit goes on to the next request.
func TestARunningRequestWhoseClientPipelinesAByteAndLeavesIsCancelledOverHTTP1(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	url := runCaddy(t, `{"handler":"fair_queue","name":"pipeline-gone-running","permits":1,"max_wait":"60s"}`, up.proxy())
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	body := `{"model":"gone"}`
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	_, err = conn.Write([]byte("P")) // a pipelined request starts
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // the byte arrives on its own
	require.NoError(t, conn.Close())

	require.Eventually(t, func() bool { return up.run.Load() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the upstream still runs the request of a client that pipelined a byte and left")
	next := chat(context.Background(), http.DefaultClient, url, `{"model":"next"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the permit was not handed on")
	up.release <- struct{}{}
	assert.Equal(t, http.StatusOK, got(t, next).status)
}

// A client that pipelines its next request while the first runs, and
// stays, is no client that left: the first runs to its end across the
// watch's looks, and both are answered in order.
func TestAPipeliningClientThatStaysGetsBothAnswersOverHTTP1(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	url := runCaddy(t, `{"handler":"fair_queue","name":"pipeline-stays","permits":1,"max_wait":"60s"}`, up.proxy())
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	req := func(model string) string {
		body := fmt.Sprintf(`{"model":%q}`, model)
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	_, err = io.WriteString(conn, req("first")+req("second"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // the watch looks at the connection meanwhile
	require.Equal(t, int32(1), up.run.Load(), "the first request was cut")
	up.release <- struct{}{}
	br := bufio.NewReader(conn)
	for _, model := range []string{"first", "second"} {
		if model == "second" {
			require.Eventually(t, func() bool { return up.total.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
			up.release <- struct{}{}
		}
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "the answer to %s", model)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, model)
	}
	assert.Equal(t, []string{`{"model":"first"}`, `{"model":"second"}`}, []string{up.nextBody(t), up.nextBody(t)})
}
