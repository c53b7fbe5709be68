package caddyfairqueue

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// BenchmarkServeHTTP1ThroughCaddy is a request that finds a permit free
// through a real Caddy server over a kept-alive HTTP/1.1 connection: the
// connection's work (the watch for its client's close included) beside
// fair_queue's, a static answer behind it. Compare with
// BenchmarkServeHTTP1ThroughCaddyWithoutQueue, the same without
// fair_queue.
func BenchmarkServeHTTP1ThroughCaddy(b *testing.B) {
	benchThroughCaddy(b, `{"handler":"fair_queue","name":"bench-conn","permits":64},`)
}

// BenchmarkServeHTTP1ThroughCaddyWithoutQueue is the baseline of
// BenchmarkServeHTTP1ThroughCaddy.
func BenchmarkServeHTTP1ThroughCaddyWithoutQueue(b *testing.B) {
	benchThroughCaddy(b, "")
}

func benchThroughCaddy(b *testing.B, queue string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s
	{"handler":"static_response","status_code":200,"body":"{\"choices\":[]}"}]}]}}}}}`, port, queue)
	if err := caddy.Load([]byte(cfg), false); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = caddy.Stop() }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := client.Post(url, "application/json", strings.NewReader(benchBody))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}
