package caddyfairqueue

import (
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

// A waiting HTTP/1 client that half-closes its connection after its
// request (a FIN, or TLS's close_notify, and reading on) is a client
// that left, as Go's server reads it: its request leaves the queue at
// once, with or without keepalive comments being written to it, and is
// never forwarded; it holds nothing while others wait.
func TestAWaiterThatHalfClosesLeavesTheQueueOverHTTP1(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		for _, keepalive := range []bool{false, true} {
			t.Run(fmt.Sprintf("tls=%v/keepalive=%v", tlsOn, keepalive), func(t *testing.T) {
				t.Cleanup(func() { poolEmpty(t) })
				up := newHeldUpstream(t)
				name := fmt.Sprintf("halfclose-%v-%v", tlsOn, keepalive)
				handler := fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"%s}`, name,
					map[bool]string{false: "", true: `,"sse_keepalive":"100ms"`}[keepalive])
				var addr string
				var c *http.Client
				if tlsOn {
					s := runTLSCaddy(t, handler, up.proxy())
					addr, c = s.addr, s.client(t, "h1")
				} else {
					url := runCaddy(t, handler, up.proxy())
					addr, c = strings.TrimPrefix(url, "http://"), http.DefaultClient
				}
				base := "http://" + addr
				if tlsOn {
					base = "https://localhost:" + addr[strings.LastIndex(addr, ":")+1:]
				}
				running := chat(context.Background(), c, base, `{"model":"m"}`)
				require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

				const n = 20
				type halfCloser interface {
					net.Conn
					CloseWrite() error
				}
				var conns []halfCloser
				for range n {
					raw, err := net.Dial("tcp", addr)
					require.NoError(t, err)
					t.Cleanup(func() { _ = raw.Close() })
					var conn halfCloser = raw.(*net.TCPConn)
					if tlsOn {
						tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"}) //nolint:gosec // a test certificate
						require.NoError(t, tc.Handshake())
						conn = tc
					}
					body := `{"model":"m","stream":true}`
					_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAccept: text/event-stream\r\n"+
						"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					require.NoError(t, err)
					go func() { _, _ = io.Copy(io.Discard, conn) }() // reads on, whatever comes
					conns = append(conns, conn)
				}
				waitQueueWaiting(t, name, n)
				for _, conn := range conns {
					require.NoError(t, conn.CloseWrite())
				}
				require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 30*time.Second, 10*time.Millisecond,
					"half-closed clients still wait")

				up.release <- struct{}{}
				a := got(t, running)
				require.NoError(t, a.err)
				assert.Equal(t, http.StatusOK, a.status)
				time.Sleep(200 * time.Millisecond) // a request wrongly granted would reach the upstream now
				assert.Equal(t, int32(1), up.total.Load(), "a half-closed client's request was forwarded")
			})
		}
	}
}
