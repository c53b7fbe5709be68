package harness

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// StartMockLLM starts an in-process mock LLM upstream and returns it and
// its host:port, for reverse_proxy. It stops when the test ends.
func StartMockLLM(t testing.TB, cfg mockllm.Config) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(cfg)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return m, strings.TrimPrefix(srv.URL, "http://")
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}
