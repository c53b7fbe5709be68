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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client that leaves once its upstream has ended, while the end of
// the answer is still on its way to it (here an HTTP/2 stream whose
// window the client leaves at 1 byte: the last bytes wait in Caddy
// after reverse_proxy returned), aborted nothing at the upstream: its
// permit goes to the next request at once, not after the abort grace
// (a minute here), which is for requests the upstream still ran.
func TestClientThatLeavesAfterItsUpstreamEndedPaysNoAbortGrace(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	name := "left-after-end"
	s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","abort_grace":"1m"}`, name), up.proxy())

	slow := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: "localhost"},
		Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 1},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, s.addr)
		}}
	slow.Protocols.SetHTTP2(true)
	t.Cleanup(slow.CloseIdleConnections)

	up.release <- struct{}{} // the first request's upstream answers at once
	req, err := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := slow.RoundTrip(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return up.total.Load() == 1 && up.run.Load() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the upstream ended the first request")
	require.NoError(t, resp.Body.Close()) // leaves: the stream is reset, the answer's end untaken

	next := chat(context.Background(), s.client(t, "h2"), s.url, `{"model":"next"}`)
	require.Equal(t, `{"model":"m"}`, up.nextBody(t))
	require.Equal(t, `{"model":"next"}`, up.nextBody(t), "the next request waits on the left one's permit")
	up.release <- struct{}{}
	a := got(t, next)
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, int32(1), up.most.Load())
}
