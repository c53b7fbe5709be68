package caddyfairqueue

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// The strings of a body that the handler decodes (its "model", a token
// count sent as a string) cost about their size, however they are
// written: a body of 2 MiB whose "model" or "n" is invalid UTF-8 bytes
// (each decoded as a 3-byte U+FFFD) allocated 16 and 13 times its size,
// and one of many short "model" keys with escapes 16.5 times (each
// decoded, though only the last counts); now about 3 times (the body
// read, and what the client and server allocate besides).
func TestTheStringsOfABodyCostAboutTheirSize(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	upstream := httptest.NewServer(mockllm.New(mockllm.Config{Tokens: 2, Delay: time.Millisecond}).Handler())
	t.Cleanup(upstream.Close)
	port := freePort(t)
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"max_header_bytes":4096,"routes":[{"handle":[
		{"handler":"fair_queue","name":"{http.fair_queue.model}","names":["llama3"],"permits":1,"kv_tokens":100000},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	const size = 2 << 20
	for _, tc := range []struct{ name, path, body string }{
		{"a model of invalid UTF-8", "/api/chat", `{"model":"` + strings.Repeat("\xff", size) + `"}`},
		{"a model of invalid UTF-8, OpenAI", "/v1/chat/completions", `{"model":"` + strings.Repeat("\xff", size) + `"}`},
		{"n of invalid UTF-8", "/v1/chat/completions", `{"model":"x","n":"` + strings.Repeat("\xff", size) + `"}`},
		{"many models", "/api/chat", "{" + strings.Repeat(`"model":"\n",`, size/13) + `"model":"x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d%s", port, tc.path), "application/json", bytes.NewReader(body))
			require.NoError(t, err)
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&after)

			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a model not in names: %s", answer)
			allocated := after.TotalAlloc - before.TotalAlloc
			// About the body once fixed (read into a buffer, then sniffed);
			// the bound leaves room for what else the process allocates.
			assert.Less(t, allocated, uint64(8*len(body)),
				"bytes allocated to answer one body of %d bytes", len(body))
			t.Logf("body %d KiB: %d KiB allocated", len(body)>>10, allocated>>10)
		})
	}
}
