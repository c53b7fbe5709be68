package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request sent in TLS early data (HTTP/3's 0-RTT, which Caddy allows
// by default) comes before the handshake that would verify its client:
// Caddy gives it no {http.request.remote.host} (and {client_ip} is an
// address nobody verified), so that a tenant taken from the address was
// empty, the default tenant every such request shared: a client escaped
// its address's max_in_flight_per_tenant and max_queue_per_tenant by
// sending in 0-RTT, and was charged apart from its own requests. With a
// tenant, such a request is answered 425 Too Early, as Caddy's
// remote_ip matcher answers it (its client sends it again once the
// handshake is done), and never reaches a queue; sent after the
// handshake, the same request is queued as its address's tenant.
func TestARequestInEarlyDataIsAnsweredTooEarlyWhenItHasATenant(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	for range 100 {
		up.release <- struct{}{}
	}
	s := runTLSCaddy(t, `{"handler":"fair_queue","name":"early-data","permits":1,"tenant":"{http.request.remote.host}"}`,
		`{"handler":"headers","response":{"set":{"X-Tenant":["{http.fair_queue.tenant}"]}}}`, up.proxy())
	tc := &tls.Config{RootCAs: s.roots, ServerName: "localhost", ClientSessionCache: tls.NewLRUClientSessionCache(10)}
	transport := func() *http3.Transport {
		tr := &http3.Transport{TLSClientConfig: tc,
			Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
				return quic.DialAddrEarly(ctx, s.addr, tc, qc)
			}}
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	send := func(tr *http3.Transport, method string) (*http.Response, string) {
		req, _ := http.NewRequest(method, s.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	first := transport()
	resp, _ := send(first, http.MethodPost) // after the handshake; it leaves a session ticket
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fairqueue.TenantKey("127.0.0.1"), resp.Header.Get("X-Tenant"), "the tenant of a request after the handshake")
	served := int32(1) // the first request
	require.Eventually(t, func() bool {
		// The ticket comes after the handshake; a request on a resumed
		// connection in 0-RTT shows it came.
		tr := transport()
		resp, body := send(tr, http3.MethodGet0RTT)
		_ = tr.Close()
		if resp.TLS == nil || !resp.TLS.DidResume {
			return false
		}
		if resp.StatusCode == http.StatusOK {
			// Sent in 0-RTT but read once the handshake was done (the
			// server, on a loaded machine, came to its stream after the
			// client's Finished): its address is verified, and it is
			// queued as the address's tenant, never the default one.
			assert.Equal(t, fairqueue.TenantKey("127.0.0.1"), resp.Header.Get("X-Tenant"),
				"a request read after the handshake (the default tenant is %s)", fairqueue.TenantKey(""))
			served++
			return false
		}
		assert.Equal(t, http.StatusTooEarly, resp.StatusCode, "a request in early data: %s", body)
		assert.Empty(t, resp.Header.Get("X-Tenant"), "a request in early data was queued, as tenant %s (the default tenant is %s)",
			resp.Header.Get("X-Tenant"), fairqueue.TenantKey(""))
		return true
	}, 30*time.Second, 50*time.Millisecond, "no request read in early data")
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, served, up.total.Load(), "a request in early data reached the upstream")
}
