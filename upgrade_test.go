package caddyfairqueue

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A WebSocket (an OpenAI Realtime session, say) through fair_queue: the
// upgraded connection holds its permit for its whole life and hands it
// on when it closes.

// tunnelUpstream answers a WebSocket upgrade with 101 and echoes each
// line sent on the connection; it answers any other request at once.
// tunnels counts the connections open, most the most open at once.
type tunnelUpstream struct {
	addr          string
	tunnels, most atomic.Int32
}

func newTunnelUpstream(t *testing.T) *tunnelUpstream {
	t.Helper()
	u := &tunnelUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		n := u.tunnels.Add(1)
		defer u.tunnels.Add(-1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
		_ = brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = brw.WriteString("echo " + line)
			_ = brw.Flush()
		}
	}))
	t.Cleanup(srv.Close)
	u.addr = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// tunnel is one side of an upgraded connection: lines go out on w and
// come back on r.
type tunnel struct {
	w io.WriteCloser
	r *bufio.Reader
}

// echo sends line and reads its echo.
func (tn tunnel) echo(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(tn.w, line+"\n")
	require.NoError(t, err)
	got, err := tn.r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo "+line+"\n", got)
}

// dialWebSocketH1 upgrades a new HTTP/1.1 connection to addr.
func dialWebSocketH1(addr string) (tunnel, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return tunnel{}, err
	}
	_, err = io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: "+addr+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	if err != nil {
		conn.Close()
		return tunnel{}, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return tunnel{}, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return tunnel{}, fmt.Errorf("status %d, not 101", resp.StatusCode)
	}
	return tunnel{w: conn, r: br}, nil
}

// dialWebSocketH3 opens a WebSocket to s over HTTP/3 with an extended
// CONNECT (RFC 9220), as Caddy's reverse_proxy takes it.
func dialWebSocketH3(t *testing.T, s *tlsCaddy) (tunnel, error) {
	tr := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
		Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			return quic.DialAddrEarly(ctx, s.addr, tc, qc)
		}}
	t.Cleanup(func() { _ = tr.Close() })
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, s.url+"/v1/realtime", pr)
	if err != nil {
		return tunnel{}, err
	}
	req.Proto = "websocket"
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return tunnel{}, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return tunnel{}, fmt.Errorf("status %d, not 200: %s", resp.StatusCode, b)
	}
	return tunnel{w: closeBoth{pw, resp.Body}, r: bufio.NewReader(resp.Body)}, nil
}

// closeBoth closes the request's and the response's bodies.
type closeBoth struct {
	io.WriteCloser
	resp io.Closer
}

func (c closeBoth) Close() error {
	_ = c.resp.Close()
	return c.WriteCloser.Close()
}

// webSocketHoldsItsPermit opens two WebSockets on a queue of one
// permit through dial: the second waits until the first closes; then
// a chat request waits until the second closes.
func webSocketHoldsItsPermit(t *testing.T, name, url string, up *tunnelUpstream, client *http.Client, dial func() (tunnel, error)) {
	t.Helper()
	first, err := dial()
	require.NoError(t, err)
	first.echo(t, "one")

	type dialed struct {
		tn  tunnel
		err error
	}
	second := make(chan dialed, 1)
	go func() {
		tn, err := dial()
		second <- dialed{tn, err}
	}()
	waitQueueWaiting(t, name, 1)
	first.echo(t, "still one") // the waiting one does not disturb it
	require.NoError(t, first.w.Close())

	var d dialed
	select {
	case d = <-second:
	case <-time.After(20 * time.Second):
		t.Fatal("the second WebSocket was not opened within 20s of the first's close")
	}
	require.NoError(t, d.err)
	d.tn.echo(t, "two")

	chatting := chat(context.Background(), client, url, `{"model":"m"}`)
	waitQueueWaiting(t, name, 1)
	d.tn.echo(t, "still two")
	require.NoError(t, d.tn.w.Close())
	a := got(t, chatting)
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, int32(1), up.most.Load(), "WebSockets open upstream at once")
}

// Over HTTP/1.1 a WebSocket holds its permit while it is open: another
// waits for it, and the permit goes on when it closes; with a pool too.
func TestWebSocketHoldsItsPermitWhileOpenOverHTTP1(t *testing.T) {
	for _, pool := range []bool{false, true} {
		t.Run(fmt.Sprintf("pool=%v", pool), func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newTunnelUpstream(t)
			name := fmt.Sprintf("ws-h1-%v", pool)
			handlers := fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"},
				{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, name, up.addr)
			if pool {
				handlers = fmt.Sprintf(`{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1}],"max_wait":"60s"},
				{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`, name, up.addr)
			}
			logPath := filepath.Join(t.TempDir(), "caddy.log")
			port := freePort(t)
			cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR",
				"writer":{"output":"file","filename":%q}}}},
			"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s]}]}}}}}`, logPath, port, handlers)
			require.NoError(t, caddy.Load([]byte(cfg), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			webSocketHoldsItsPermit(t, name, "http://"+addr, up, http.DefaultClient, func() (tunnel, error) { return dialWebSocketH1(addr) })

			// The sockets' ends are no errors: nothing writes to a hijacked
			// connection (net/http panics on a flush of one).
			logged, err := os.ReadFile(logPath)
			require.NoError(t, err)
			assert.NotContains(t, string(logged), "panic", "Caddy's error log")
		})
	}
}

// Over HTTP/3 a WebSocket is an extended CONNECT whose request body is
// the client's side of the connection: it never ends while the socket
// is open. fair_queue must not wait for it (body_timeout), and the
// socket holds its permit while it is open.
func TestWebSocketHoldsItsPermitWhileOpenOverHTTP3(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newTunnelUpstream(t)
	s := runTLSCaddy(t, `{"handler":"fair_queue","name":"ws-h3","permits":1,"max_wait":"60s","body_timeout":"1s"}`,
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, up.addr))
	webSocketHoldsItsPermit(t, "ws-h3", s.url, up, s.client(t, "h3"), func() (tunnel, error) { return dialWebSocketH3(t, s) })
}
