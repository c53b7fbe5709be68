package caddyfairqueue

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/require"
)

// A Caddy in this process serving HTTPS with HTTP/1.1, HTTP/2 and
// HTTP/3 on one port (TCP and UDP), with a test certificate, and a
// client for each protocol that trusts it.

// tlsCaddy is a running Caddy's HTTPS address and its certificate pool.
type tlsCaddy struct {
	url   string // https://localhost:<port>
	addr  string // 127.0.0.1:<port>
	roots *x509.CertPool
}

// testCertificate writes a self-signed certificate for localhost and
// 127.0.0.1 and its key under dir; it returns their paths and a pool
// that trusts it.
func testCertificate(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// runTLSCaddy runs Caddy in this process with one HTTPS server (h1, h2
// and h3) whose route has handlers (JSON objects, in order).
func runTLSCaddy(t *testing.T, handlers ...string) *tlsCaddy {
	t.Helper()
	return runTLSCaddyWith(t, "", handlers...)
}

// runTLSCaddyWith is runTLSCaddy with more fields of the server (JSON,
// each followed by a comma).
func runTLSCaddyWith(t *testing.T, server string, handlers ...string) *tlsCaddy {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	certFile, keyFile, roots := testCertificate(t, dir)
	port := freePort(t)
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{
	"tls":{"certificates":{"load_files":[{"certificate":%q,"key":%q}]}},
	"http":{"grace_period":"1s","servers":{"s":{%s"listen":["127.0.0.1:%d"],"protocols":["h1","h2","h3"],
		"automatic_https":{"disable":true},"tls_connection_policies":[{}],
		"routes":[{"handle":[%s]}]}}}}}`, certFile, keyFile, server, port, strings.Join(handlers, ","))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	return &tlsCaddy{
		url:   fmt.Sprintf("https://localhost:%d", port),
		addr:  fmt.Sprintf("127.0.0.1:%d", port),
		roots: roots,
	}
}

// client returns an HTTP client for proto ("h1", "h2" or "h3") that
// trusts the server's certificate and dials 127.0.0.1.
func (s *tlsCaddy) client(t *testing.T, proto string) *http.Client {
	t.Helper()
	c, _ := s.closableClient(t, proto)
	return c
}

// closableClient is client, and what closes its connections at once,
// requests in flight included (a client that goes away).
func (s *tlsCaddy) closableClient(t *testing.T, proto string) (c *http.Client, closeConns func()) {
	t.Helper()
	tc := &tls.Config{RootCAs: s.roots, ServerName: "localhost"}
	switch proto {
	case "h3":
		tr := &http3.Transport{TLSClientConfig: tc,
			Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
				return quic.DialAddrEarly(ctx, s.addr, tc, qc)
			}}
		t.Cleanup(func() { _ = tr.Close() })
		return &http.Client{Transport: tr}, func() { _ = tr.Close() }
	case "h1", "h2":
		var mu sync.Mutex
		var conns []net.Conn
		tr := &http.Transport{TLSClientConfig: tc, Protocols: new(http.Protocols)}
		if proto == "h2" {
			tr.Protocols.SetHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, s.addr)
			if err == nil {
				mu.Lock()
				conns = append(conns, conn)
				mu.Unlock()
			}
			return conn, err
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}, func() {
			mu.Lock()
			defer mu.Unlock()
			for _, conn := range conns {
				_ = conn.Close()
			}
		}
	}
	t.Fatalf("unknown protocol %q", proto)
	return nil, nil
}
