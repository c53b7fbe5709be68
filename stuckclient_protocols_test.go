package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiting stream whose client reads nothing (here over HTTP/3, its
// stream's window left at 1 byte) is given up once its keepalive comment
// has not been taken within the frame bound: when the permit comes, the
// request is not forwarded, and the permit goes to the next live
// request. Over HTTP/2 giving up the frame resets the stream, which ends
// the request's context; over HTTP/3 (and HTTP/1) it does not, and the
// grant was forwarded upstream for a response nobody could receive,
// holding the permit while live requests waited.
func TestAGrantedStreamWhoseClientReadsNothingOverHTTP3IsNotForwarded(t *testing.T) {
	grantToAClientThatReadsNothing(t, "h3", func(s *tlsCaddy) http.RoundTripper {
		tr := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
			QUICConfig: &quic.Config{InitialStreamReceiveWindow: 1, MaxStreamReceiveWindow: 1},
			Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
				return quic.DialAddrEarly(ctx, s.addr, tc, qc)
			}}
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	})
}

// The same over HTTP/2, its stream's window left at 1 byte.
func TestAGrantedStreamWhoseClientReadsNothingOverHTTP2IsNotForwarded(t *testing.T) {
	grantToAClientThatReadsNothing(t, "h2", func(s *tlsCaddy) http.RoundTripper {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
			Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 1},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, s.addr)
			}}
		tr.Protocols.SetHTTP2(true)
		t.Cleanup(tr.CloseIdleConnections)
		return tr
	})
}

// grantToAClientThatReadsNothing grants a permit to a waiting stream
// whose client, on stuck, reads nothing of its answer, and checks that
// the permit goes on to the next request.
func grantToAClientThatReadsNothing(t *testing.T, proto string, stuck func(*tlsCaddy) http.RoundTripper) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	name := "stuck-" + proto
	s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","sse_keepalive":"100ms","sse_queue_events":true}`, name), up.proxy())
	c := s.client(t, proto)
	first := chat(context.Background(), c, s.url, `{"model":"m"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	tr := stuck(s)
	header := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
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
	waitQueueWaiting(t, name, 1)
	time.Sleep(3 * time.Second) // comments fill quic-go's buffer, then block behind the window

	up.release <- struct{}{} // the stuck stream is granted
	assert.Equal(t, http.StatusOK, got(t, first).status)
	up.nextBody(t) // first's
	next := chat(context.Background(), c, s.url, `{"model":"next"}`)
	require.Equal(t, `{"model":"next"}`, up.nextBody(t), "the stuck stream's request ran upstream")
	up.release <- struct{}{}
	a := got(t, next)
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, int32(2), up.total.Load(), "the stuck stream's request ran upstream")
}

// A waiting stream whose client takes none of its keepalive's comments
// (its stream's window left at 1 byte) leaves the queue once a comment
// has not been taken within the frame bound, not at max_wait: with
// max_queue 1 a real request then waits in its place and is served.
// Before, the stuck stream kept its place (and its queue among the
// handler's, and its share of max_queue_per_tenant) for the whole of
// max_wait, and the real request was refused queue_full.
func TestAWaitingStreamWhoseClientReadsNothingLeavesTheQueueOverEachProtocol(t *testing.T) {
	for _, proto := range []string{"h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			up := newHeldUpstream(t)
			name := "stuck-waiter-" + proto
			s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_queue":1,"max_wait":"60s","sse_keepalive":"100ms"}`, name), up.proxy())
			c := s.client(t, proto)
			first := chat(context.Background(), c, s.url, `{"model":"m"}`)
			require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

			var tr http.RoundTripper
			if proto == "h3" {
				h3 := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
					QUICConfig: &quic.Config{InitialStreamReceiveWindow: 1, MaxStreamReceiveWindow: 1},
					Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
						return quic.DialAddrEarly(ctx, s.addr, tc, qc)
					}}
				t.Cleanup(func() { _ = h3.Close() })
				tr = h3
			} else {
				h2 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
					Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 1},
					DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
						return (&net.Dialer{}).DialContext(ctx, network, s.addr)
					}}
				h2.Protocols.SetHTTP2(true)
				t.Cleanup(h2.CloseIdleConnections)
				tr = h2
			}
			go func() {
				req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				req.Header.Set("Accept", "text/event-stream")
				_, _ = tr.RoundTrip(req) // the body is never read
			}()
			waitQueueWaiting(t, name, 1)
			require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 30*time.Second, 10*time.Millisecond,
				"the stream whose client reads nothing still waits in the queue")

			real := chat(context.Background(), c, s.url, `{"model":"real"}`)
			waitQueueWaiting(t, name, 1)
			up.release <- struct{}{}
			up.release <- struct{}{}
			for _, ch := range []<-chan answer{first, real} {
				a := got(t, ch)
				require.NoError(t, a.err)
				assert.Equal(t, http.StatusOK, a.status)
			}
			assert.Equal(t, int32(2), up.total.Load(), "the stuck stream's request ran upstream")
		})
	}
}
