package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A hostile or broken upstream's over-long SSE data line costs about its
// size to read for usage, whatever its tail holds: a tail of 16 KiB made
// of nothing but `"usage":{` (1,800 keys, none closing the line) had
// each key tried as the usage's start, a copy of the rest of the tail
// and a validation of it per key: about 60 MiB allocated and as much
// scanned per line of 64 KiB, 900 times what the upstream sent.
func TestAHostileUsageTailCostsAboutItsSize(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	pad := "data: {\"pad\":\"" + strings.Repeat("x", maxSSELine) + "\","
	var line string
	const lines = 8
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range lines {
			_, _ = io.WriteString(w, line)
		}
	}))
	t.Cleanup(upstream.Close)
	port := freePort(t)
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"hostile-tail","permits":1,"tenant":"t","cost":"tokens"},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)

	for _, tc := range []struct{ name, tail string }{
		{"keys", strings.Repeat(`"usage":{`, sseTail/len(`"usage":{`))},
		{"keys, then deep arrays", strings.Repeat(`"usage":{`, 16) + `"a":` + strings.Repeat("[", sseTail/2)},
		{"escaped keys", strings.Repeat(`\"usage\":{`, sseTail/len(`\"usage\":{`))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line = pad + tc.tail + "\n\n"
			passesAtAboutItsSize(t, url, int64(lines*len(line)))
		})
	}
}

// passesAtAboutItsSize posts a streaming request to url and checks that
// its answer, of size bytes, passes whole, allocating a few times that.
func passesAtAboutItsSize(t *testing.T, url string, size int64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)

	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, size, n, "the answer passes whole")
	allocated := after.TotalAlloc - before.TotalAlloc
	// A few times the answer at most (the proxy's buffers, the line's
	// tail); the bound leaves room for what else the process allocates.
	assert.Less(t, allocated, uint64(8*n),
		"bytes allocated to pass an answer of %d bytes whose long lines end in `\"usage\":{` keys", n)
	t.Logf("answer %d KiB: %d KiB allocated", n>>10, allocated>>10)
}

// BenchmarkUsageTail reads the usage of a response whose over-long data
// lines end in a tail of keys (the worst a tail holds) or in a Responses
// API usage: per byte of the response, about the same.
func BenchmarkUsageTail(b *testing.B) {
	pad := "data: {\"pad\":\"" + strings.Repeat("x", maxSSELine) + "\","
	for name, line := range map[string]string{
		"keys":  pad + strings.Repeat(`"usage":{`, sseTail/len(`"usage":{`)) + "\n\n",
		"usage": responsesCompleted(longText, realUsage),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			for range b.N {
				u := newUsageWriter(httptest.NewRecorder())
				u.Header().Set("Content-Type", "text/event-stream")
				_, _ = u.Write([]byte(line))
				u.totalTokens()
			}
		})
	}
}
