package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"fmt"
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
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	const name = "stuck-h3"
	s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","sse_keepalive":"100ms","sse_queue_events":true}`, name), up.proxy())
	c := s.client(t, "h3")
	first := chat(context.Background(), c, s.url, `{"model":"m"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	tr := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
		QUICConfig: &quic.Config{InitialStreamReceiveWindow: 1, MaxStreamReceiveWindow: 1},
		Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			return quic.DialAddrEarly(ctx, s.addr, tc, qc)
		}}
	t.Cleanup(func() { _ = tr.Close() })
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
