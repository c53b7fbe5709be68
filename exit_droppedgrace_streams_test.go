package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
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

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// TestExitAfterAReloadDroppedALongAbortGraceWaitsOnlyTheGraceStillInForce
// over HTTP/2 and HTTP/3: a stream whose client keeps its flow-control
// window shut (it reads nothing after the header) blocks reverse_proxy's
// writes to it, as a full TCP window does over HTTP/1; the exit waits for
// it the grace of the handler in force (the default), not the minute of
// the handler a reload dropped.
func TestExitAfterAReloadDroppedALongAbortGraceWaitsOnlyTheGraceStillInForceOverStreams(t *testing.T) {
	for _, proto := range []string{"h2", "h3"} {
		t.Run(proto, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)

			var arrivals atomic.Int32
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrivals.Add(1)
				streamUntilGone(w, r)
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { exitingForTest.Store(false) })

			dir := t.TempDir()
			t.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
			t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
			certFile, keyFile, roots := testCertificate(t, dir)
			port := freePort(t)
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			config := func(handler string) []byte {
				return []byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"apps":{
				"tls":{"certificates":{"load_files":[{"certificate":%q,"key":%q}]}},
				"http":{"grace_period":"300ms","servers":{"s":{"listen":["127.0.0.1:%d"],"protocols":["h1","h2","h3"],
					"automatic_https":{"disable":true},"tls_connection_policies":[{}],
					"routes":[{"handle":[%s,
					{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}]}]}}}}}`,
					certFile, keyFile, port, handler, strings.TrimPrefix(upstream.URL, "http://")))
			}
			require.NoError(t, caddy.Load(config(fmt.Sprintf(
				`{"handler":"fair_queue","name":"long","permits":1,"abort_grace":"1m","redis":{"addresses":[%q]}}`,
				rds.Addr())), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			require.NoError(t, caddy.Load(config(fmt.Sprintf(
				`{"handler":"fair_queue","name":"a","permits":1,"max_wait":"60s","redis":{"addresses":[%q]}}`,
				rds.Addr())), false))

			// A client whose stream window is one byte, and never reopened:
			// it reads nothing of the body.
			tc := &tls.Config{RootCAs: roots, ServerName: "localhost"}
			var rt http.RoundTripper
			if proto == "h3" {
				h3 := &http3.Transport{TLSClientConfig: tc,
					QUICConfig: &quic.Config{InitialStreamReceiveWindow: 1, MaxStreamReceiveWindow: 1},
					Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
						return quic.DialAddrEarly(ctx, addr, tc, qc)
					}}
				t.Cleanup(func() { _ = h3.Close() })
				rt = h3
			} else {
				h2 := &http.Transport{TLSClientConfig: tc, Protocols: new(http.Protocols),
					HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 1}}
				h2.Protocols.SetHTTP2(true)
				t.Cleanup(h2.CloseIdleConnections)
				rt = h2
			}
			req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("https://localhost:%d/v1/chat/completions", port),
				strings.NewReader(`{"stream":true,"messages":[]}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			resp, err := rt.RoundTrip(req)
			require.NoError(t, err)
			t.Cleanup(func() { resp.Body.Close() })
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
				"the stream reaches the upstream")
			time.Sleep(300 * time.Millisecond) // its writes to the client block

			exitingForTest.Store(true) // the process exits (SIGTERM, caddy stop)
			start := time.Now()
			stopped := make(chan error, 1)
			go func() { stopped <- caddy.Stop() }()
			select {
			case <-stopped:
				assert.Less(t, time.Since(start), 30*time.Second)
			case <-time.After(45 * time.Second):
				t.Fatal("caddy.Stop still waits 45s after the exit began, for a request whose abort grace is 50ms " +
					"(the abort grace of 1m belonged to a handler a reload dropped)")
			}
		})
	}
}
