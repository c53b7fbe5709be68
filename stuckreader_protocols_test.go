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
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/require"
)

// endlessUpstream holds a request of model "block" until release is
// closed, answers one of model "stuck" with an event stream that never
// ends (16 KiB events, flushed, until its client leaves), and others at
// once; it counts the requests of each model that reached it.
type endlessUpstream struct {
	url                   string
	blocked, stuck, other atomic.Int32
	release               chan struct{}
}

func newEndlessUpstream(t *testing.T) *endlessUpstream {
	t.Helper()
	u := &endlessUpstream{release: make(chan struct{})}
	event := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), `"block"`):
			u.blocked.Add(1)
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		case strings.Contains(string(b), `"stuck"`):
			u.stuck.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			for r.Context().Err() == nil {
				if _, err := w.Write([]byte(event)); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
			return
		default:
			u.other.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[]}`))
	}))
	t.Cleanup(srv.Close)
	u.url = srv.URL
	return u
}

// stoppingReader is a client over proto that reads a streamed answer
// until its first data event, then reads nothing more (its window or
// socket buffers left to fill), keeping its connection open.
func stoppingReader(t *testing.T, s *tlsCaddy, proto string) http.RoundTripper {
	t.Helper()
	tc := &tls.Config{RootCAs: s.roots, ServerName: "localhost"}
	if proto == "h3" {
		tr := &http3.Transport{TLSClientConfig: tc,
			QUICConfig: &quic.Config{InitialStreamReceiveWindow: 64 << 10, MaxStreamReceiveWindow: 64 << 10},
			Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
				return quic.DialAddrEarly(ctx, s.addr, tc, qc)
			}}
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	tr := &http.Transport{TLSClientConfig: tc, Protocols: new(http.Protocols),
		HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, s.addr)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(4 << 10)
			}
			return c, err
		}}
	if proto == "h2" {
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// A client granted a streamed answer that stops reading it (its stream's
// window or its socket's buffers full) holds its permit only until a
// write to it stalls for the server's write_idle_timeout (Caddy's
// default one minute): the write fails, the answer ends, the permit goes
// on. So over each protocol, also after the queue's keepalive comments
// set and lifted write deadlines of their own while it waited.
func TestAGrantedClientThatStopsReadingGivesItsPermitBackOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		for _, keepalive := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/keepalive=%v", proto, keepalive), func(t *testing.T) {
				stoppedReaderGivesPermitBack(t, proto, keepalive, `"write_idle_timeout":"1s",`)
			})
		}
	}
}

// stoppedReaderGivesPermitBack: a stream whose client stops reading
// after its first event, on a server with the settings server (JSON,
// each followed by a comma), gives its permit to the next request.
func stoppedReaderGivesPermitBack(t *testing.T, proto string, keepalive bool, server string) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newEndlessUpstream(t)
	name := fmt.Sprintf("stopped-reader-%s-%v", proto, keepalive)
	ka := ""
	if keepalive {
		ka = `"sse_keepalive":"100ms",`
	}
	s := runTLSCaddyWith(t, server, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"120s",%s"max_queue":10}`, name, ka),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.url, "http://")))

	// A request holds the permit while the stopping reader waits (fed
	// keepalive comments, when on), then lets it run.
	blocker := chat(context.Background(), s.client(t, "h2"), s.url, `{"model":"block"}`)
	require.Eventually(t, func() bool { return up.blocked.Load() == 1 }, 30*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stopped := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"stuck","stream":true}`))
		req.Header.Set("Accept", "text/event-stream")
		resp, err := stoppingReader(t, s, proto).RoundTrip(req)
		if err != nil {
			stopped <- err
			return
		}
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil || strings.HasPrefix(line, "data: x") {
				stopped <- err
				return // and reads nothing more; the connection stays open
			}
		}
	}()
	waitQueueWaiting(t, name, 1)
	time.Sleep(500 * time.Millisecond) // keepalive comments, when on
	close(up.release)
	require.NoError(t, got(t, blocker).err)
	select {
	case err := <-stopped:
		require.NoError(t, err, "the stopping reader's answer")
	case <-time.After(30 * time.Second):
		t.Fatal("the stopping reader got no event")
	}
	next := chat(context.Background(), s.client(t, "h2"), s.url, `{"model":"next"}`)
	require.Eventually(t, func() bool { return up.other.Load() == 1 }, 90*time.Second, 20*time.Millisecond,
		"the permit of the client that stopped reading never came back")
	a := got(t, next)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status)
}

// With write_idle_timeout off, the server's write_timeout ends an
// answer whose client stopped reading, and the permit goes on, over
// HTTP/1 and HTTP/2 (Caddy gives HTTP/3 no write timeout); also after
// the queue's keepalive comments set and lifted write deadlines of
// their own while the request waited.
func TestAWriteTimeoutEndsAGrantedClientThatStopsReadingAfterKeepalives(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		for _, keepalive := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/keepalive=%v", proto, keepalive), func(t *testing.T) {
				stoppedReaderGivesPermitBack(t, proto, keepalive, `"write_idle_timeout":-1,"write_timeout":"3s",`)
			})
		}
	}
}
