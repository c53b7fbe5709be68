package caddyfairqueue

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/require"
)

func init() { caddy.RegisterModule(shutWindow{}) }

// shutWindow is a listener wrapper whose connections play a client whose
// TCP receive window shuts, its buffers full, right after the server has
// written After: every later write blocks, as a write to such a client
// does, until the connection's write deadline passes (never, without
// one), the connection is closed, or the client closes its end (which
// makes a real socket's blocked write fail). It stands for the kernel's buffers
// filling exactly at a frame's end, which a test cannot arrange on a
// real socket.
type shutWindow struct {
	After string `json:"after,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (shutWindow) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.listeners.fq_test_shut_window", New: func() caddy.Module { return new(shutWindow) }}
}

// WrapListener wraps l's connections.
func (s shutWindow) WrapListener(l net.Listener) net.Listener {
	return shutListener{Listener: l, after: []byte(s.After)}
}

type shutListener struct {
	net.Listener
	after []byte
}

func (l shutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &shutConn{Conn: c, after: l.after, wake: make(chan struct{}), closed: make(chan struct{}),
		gone: make(chan struct{})}, nil
}

type shutConn struct {
	net.Conn
	after []byte

	mu     sync.Mutex
	shut   bool
	dl     time.Time
	wake   chan struct{} // closed and replaced when the deadline changes
	closed chan struct{}
	once   sync.Once
	gone   chan struct{} // closed once a read finds the client's end closed
	left   sync.Once
}

// Read reads from the client; an end or an error other than a deadline
// passing (the server's own way to stop its background read) is the
// client gone: a write blocked on it fails, as on a real socket.
func (c *shutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		c.left.Do(func() { close(c.gone) })
	}
	return n, err
}

func (c *shutConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	shut := c.shut
	c.mu.Unlock()
	if shut {
		return 0, c.block()
	}
	n, err := c.Conn.Write(b)
	if bytes.Contains(b, c.after) {
		c.mu.Lock()
		c.shut = true
		c.mu.Unlock()
	}
	return n, err
}

// block waits for the write deadline, or the connection's close.
func (c *shutConn) block() error {
	for {
		c.mu.Lock()
		dl, wake := c.dl, c.wake
		c.mu.Unlock()
		var expired <-chan time.Time
		if !dl.IsZero() {
			if !time.Now().Before(dl) {
				return timeoutError{}
			}
			expired = time.After(time.Until(dl))
		}
		select {
		case <-expired:
			return timeoutError{}
		case <-wake:
		case <-c.closed:
			return net.ErrClosed
		case <-c.gone:
			return syscall.ECONNRESET
		}
	}
}

func (c *shutConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.dl = t
	close(c.wake)
	c.wake = make(chan struct{})
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *shutConn) SetDeadline(t time.Time) error {
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *shutConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// timeoutError is a write's deadline passing, as net reports it.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// The last bytes of an answer the queue wrote itself (a reject, an
// error event) go out after its handler returns, when Go's server
// flushes the response (an HTTP/1 chunked stream's terminator, a plain
// answer's whole body): with Caddy's write_idle_timeout on (its
// default), that flush has the write deadline any answer's last write
// leaves, and a client whose window shuts just then is let go once it
// passes; before, the queue's bound on its frame was lifted to no
// deadline at all, and such a client held its connection and its
// goroutine for as long as it kept the connection open.
func TestTheLastFlushOfARejectHasAWriteDeadlineOverHTTP1(t *testing.T) {
	for _, tc := range []struct {
		name, after, request string
	}{
		// a plain request rejected: its 429 goes out whole at the
		// flush, after the answer to a request pipelined before it
		{"plain", "FIRST-ANSWER",
			"GET /first HTTP/1.1\r\nHost: x\r\n\r\n" + chatRequest(`{"model":"m"}`, "")},
		// a stream sse_keepalive committed: the window shuts right
		// after its reject event, before the chunked stream's end
		{"stream", `"code":"timeout"`, chatRequest(`{"model":"m","stream":true}`, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "final-flush-" + tc.name
			port := freePort(t)
			cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
			"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"write_idle_timeout":"2s",
				"listener_wrappers":[{"wrapper":"fq_test_shut_window","after":%q}],
				"routes":[
					{"match":[{"path":["/first"]}],"handle":[{"handler":"static_response","body":"FIRST-ANSWER"}]},
					{"handle":[{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"500ms","sse_keepalive":"100ms"},%s]}]}}}}}`,
				port, tc.after, name, up.proxy())
			require.NoError(t, caddy.Load([]byte(cfg), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			addr := fmt.Sprintf("127.0.0.1:%d", port)

			// the permit is held, so that the next request waits out max_wait
			holder, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { holder.Close() })
			_, err = io.WriteString(holder, chatRequest(`{"model":"m"}`, ""))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close() })
			_, err = io.WriteString(conn, tc.request)
			require.NoError(t, err)

			// the server lets the connection go once the flush's
			// deadline passes: the client reads what was written, then
			// the close
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
			read, err := io.ReadAll(bufio.NewReader(conn))
			require.NoError(t, err, "the server still holds the connection 30s after the reject (read so far: %q)", read)
			require.Contains(t, string(read), tc.after)
			up.release <- struct{}{}
		})
	}
}

// chatRequest is an HTTP/1 chat completion request with body, and the
// extra header lines header.
func chatRequest(body, header string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
		header, len(body), body)
}

// So over HTTP/3, where a plain reject's body (a 429's JSON, which the
// handler does not flush) goes out as the handler returns: quic-go takes
// a small one at once, but a configured body of a few KiB waits there
// for the client's window, and a client that left it shut held the
// stream's goroutine for as long as it kept its connection open (QUIC's
// idle timeout does not end a connection whose client acknowledges).
// Over HTTP/2 Caddy's write_idle_timeout arms that flush's deadline
// itself.
func TestTheLastFlushOfARejectHasAWriteDeadlineOverHTTP3(t *testing.T) {
	rejectToAShutHTTP3Window(t, "final-flush-h3", `"write_idle_timeout":"5s",`)
}

// That deadline is within write_timeout, as Caddy's own writes over
// HTTP/3 are (write_idle_timeout applies it there): a write_idle_timeout
// longer than what is left of write_timeout does not extend it. Before,
// the flush after the reject had write_idle_timeout's whole deadline
// from then, past write_timeout.
func TestTheLastFlushOfARejectOverHTTP3IsWithinWriteTimeout(t *testing.T) {
	rejectToAShutHTTP3Window(t, "final-flush-h3-write-timeout", `"write_timeout":"6s","write_idle_timeout":"10m",`)
}

// rejectToAShutHTTP3Window has a request over HTTP/3 rejected by queue
// name (max_wait 500ms, a reject body of 3 KiB) on a server with the
// fields server (JSON, each followed by a comma), its client's stream
// window left shut, and checks that the server, seen flushing the
// reject's body (its deadline must leave it a few seconds), gives the
// flush up within 30s.
func rejectToAShutHTTP3Window(t *testing.T, name, server string) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	body := `{"error":{"message":"` + strings.Repeat("busy ", 600) + `"}}`
	s := runTLSCaddyWith(t, server,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"500ms","reject":[{"body":%q}]}`, name, body), up.proxy())
	first := chat(context.Background(), s.client(t, "h3"), s.url, `{"model":"m"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	h3 := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
		QUICConfig: &quic.Config{InitialStreamReceiveWindow: 1, MaxStreamReceiveWindow: 1},
		Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			return quic.DialAddrEarly(ctx, s.addr, tc, qc)
		}}
	t.Cleanup(func() { _ = h3.Close() })
	req, err := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	resp, err := h3.RoundTrip(req) // the header of its 429; its body is never read
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	// the flush waits for the client: the check below would pass
	// vacuously were flushingToHTTP3 blind to it (quic-go's names changed)
	require.Eventually(t, flushingToHTTP3, 2*time.Second, 5*time.Millisecond,
		"no goroutine seen flushing the reject to a client that reads nothing")
	// the first request answered now, well within any write_timeout
	up.release <- struct{}{}
	require.NoError(t, got(t, first).err)

	require.Eventually(t, func() bool { return !flushingToHTTP3() }, 30*time.Second, 100*time.Millisecond,
		"the server still flushes the reject to a client that reads nothing")
}

// flushingToHTTP3 reports whether a goroutine of this process waits in
// the flush of an HTTP/3 response for its client's window.
func flushingToHTTP3() bool {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "http3.(*responseWriter).Flush") && strings.Contains(g, "SendStream).Write") {
			return true
		}
	}
	return false
}
