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

// Reading an Ollama body (/api/chat, read with keys in any case, as Go
// reads it) costs about what the body holds, whatever its messages:
// docs/hostile-clients.md bounds an instance's memory by the bodies it
// holds. A body of messages each two bytes long ("0,") made the
// handler keep 24 bytes per message, to replay a repeated array as Go
// decodes it: 140 MiB allocated for a body of 2 MiB, half a GiB for one
// of 8 MiB.
func TestAnOllamaBodyOfManyMessagesCostsAboutItsSize(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	upstream := httptest.NewServer(mockllm.New(mockllm.Config{Tokens: 2, Delay: time.Millisecond}).Handler())
	t.Cleanup(upstream.Close)
	port := freePort(t)
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"{http.fair_queue.model}","names":["llama3"],"permits":1,"kv_tokens":100000},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/api/chat", port)

	for _, tc := range []struct{ name, el, again string }{
		{"one messages key", `0,`, ``},
		{"messages twice", `0,`, `,"MESSAGES":[0]`},
		{"messages with images twice", `{"images":[0]},`, `,"Messages":[{}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			b.WriteString(`{"model":"other","messages":[`)
			for b.Len() < 2<<20 {
				b.WriteString(tc.el)
			}
			b.WriteString(`0]` + tc.again + `}`)
			body := b.Bytes()

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			resp, err := http.Post(url, "application/json", bytes.NewReader(body))
			require.NoError(t, err)
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&after)

			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a model not in names: %s", answer)
			assert.Equal(t, `{"error":"The model this request names is not served here."}`, string(answer))
			allocated := after.TotalAlloc - before.TotalAlloc
			// About 3x here (the body read into a buffer, then sniffed); the
			// bound leaves room for what else the process allocates
			// meanwhile, far below the 70x of a record kept per message.
			assert.Less(t, allocated, uint64(8*len(body)),
				"bytes allocated to answer one body of %d bytes (read into a buffer that doubles, then sniffed)", len(body))
			t.Logf("body %d KiB: %d KiB allocated", len(body)>>10, allocated>>10)
		})
	}
}
