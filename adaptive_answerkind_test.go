package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What adaptive times is decided by the answer, not by what the client
// says it accepts: a client that sends Accept: text/event-stream with
// "stream": false (or "stream": true to an endpoint that never streams)
// gets a plain answer, whose first byte comes after the whole
// generation; timed as a time to first token, any client could pull
// everybody's capacity down to its floor. Each case runs 700 ms
// generations against target_ttft 300ms: a plain answer leaves the share
// alone, a stream whose first chunk came that late brings it down, an
// event stream or NDJSON by its Content-Type, or one without a
// Content-Type that its body asked for. TGI's native /generate never
// streams, whatever its body says: one its client gave up on before
// the answer's header is no stream whose first token came late.
func TestAdaptiveJudgesTheAnswerNotTheAcceptHeader(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const generation = 700 * time.Millisecond
	const giveUp = 500 * time.Millisecond // after the target, before the answer
	// generate takes a generation's time, or less when its request ends
	// (the case is over: the upstream's Close waits for nobody).
	generate := func(r *http.Request) bool {
		select {
		case <-time.After(generation):
			return true
		case <-r.Context().Done():
			return false
		}
	}
	plainJSON := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if !generate(r) { // the whole generation, then the plain answer
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	}
	stream := func(contentType, chunk string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if contentType != "" {
				w.Header().Set("Content-Type", contentType)
			} else {
				w.Header()["Content-Type"] = nil // none: not even the text/plain Go would sniff
			}
			if !generate(r) { // the prefill before the first chunk
				return
			}
			_, _ = io.WriteString(w, chunk)
			w.(http.Flusher).Flush()
		}
	}
	for _, tc := range []struct {
		name, path, body string
		accept           bool          // the client sends Accept: text/event-stream
		clientTimeout    time.Duration // the client gives up after this (0: never)
		keepalive        bool          // permits 1 and sse_keepalive: waiting streams are committed, then relayed
		upstream         http.HandlerFunc
		down             bool // the share must come down
	}{
		{"a plain answer to a client that accepts event streams", "/v1/chat/completions", `{"model":"m","stream":false}`,
			true, 0, false, plainJSON, false},
		{"a plain answer relayed on a stream the keepalive committed", "/v1/chat/completions", `{"model":"m","stream":false}`,
			true, 0, true, plainJSON, false},
		{"a plain answer its client gave up waiting for", "/v1/chat/completions", `{"model":"m","stream":false}`,
			true, giveUp, false, plainJSON, false},
		{"embeddings asked to stream", "/v1/embeddings", `{"model":"m","stream":true,"input":"x"}`,
			false, 0, false, plainJSON, false},
		{"TGI's /generate asked to stream, given up before its plain answer", "/generate", `{"inputs":"x","stream":true}`,
			false, giveUp, false, plainJSON, false},
		{"an event stream", "/v1/chat/completions", `{"model":"m","stream":true}`,
			false, 0, false, stream("text/event-stream", "data: {}\n\n"), true},
		{"an event stream its client did not ask for in the body", "/generate_stream", `{"inputs":"x"}`,
			false, 0, false, stream("text/event-stream", "data: {}\n\n"), true},
		{"Ollama's NDJSON stream, streaming by default", "/api/chat", `{"model":"m"}`,
			false, 0, false, stream("application/x-ndjson", "{}\n"), true},
		{"a stream without a Content-Type", "/v1/chat/completions", `{"model":"m","stream":true}`,
			false, 0, false, stream("", "data: {}\n\n"), true},
		{"vLLM's demo /generate stream, without a Content-Type", "/generate", `{"prompt":"x","stream":true}`,
			false, 0, false, stream("", "{\"text\":[\"x\"]}\x00"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var answered atomic.Int32 // the generations the upstream finished
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tc.upstream(w, r)
				answered.Add(1)
			}))
			t.Cleanup(upstream.Close)
			name := "adapt-answerkind-" + strings.ReplaceAll(tc.name, " ", "-")
			permits, atOnce := `"permits":8`, 4 // the 4 clients' requests run together
			if tc.keepalive {
				permits, atOnce = `"permits":1,"sse_keepalive":"100ms"`, 1
			}
			port := freePort(t)
			config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,%s,"max_wait":"60s",
		 "adaptive":{"target_ttft":"300ms","min_samples":2,"interval":"100ms","decrease":0.5,"step":0.25}},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
				port, name, permits, strings.TrimPrefix(upstream.URL, "http://"))
			require.NoError(t, caddy.Load([]byte(config), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			url := fmt.Sprintf("http://127.0.0.1:%d%s", port, tc.path)
			client := &http.Client{Timeout: tc.clientTimeout}

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for ctx.Err() == nil {
						req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(tc.body))
						req.Header.Set("Content-Type", "application/json")
						if tc.accept {
							req.Header.Set("Accept", "text/event-stream")
						}
						if resp, err := client.Do(req); err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							_ = resp.Body.Close()
						}
					}
				})
			}
			defer func() { cancel(); wg.Wait() }()
			if tc.down {
				assert.Eventually(t, func() bool { return learnedShare(t, name) < 1 }, 20*time.Second, 50*time.Millisecond,
					"streams whose first chunk came 700 ms after forwarding (target 300 ms) left the learned share at %v", learnedShare(t, name))
				return
			}
			// Three rounds of answers, 4 (or 1) at a time: timed, the
			// first 2 (min_samples) would have brought the share down;
			// then a few intervals for the last ones' report.
			require.Eventually(t, func() bool { return answered.Load() >= int32(3*atOnce) }, 30*time.Second, 20*time.Millisecond,
				"the upstream answered %d generations", answered.Load())
			time.Sleep(300 * time.Millisecond)
			assert.Equal(t, 1.0, learnedShare(t, name), "plain answers, whose first byte comes after the whole generation, lowered the learned share")
		})
	}
}

// A quick plain-text answer is no stream, whatever the body asked: every
// backend answers its Prometheus /metrics at once as text/plain (Ollama
// its "Ollama is running" at /), and a client sending {"stream": true}
// there, many times a second, must not have those answers timed as
// first tokens: they would outnumber everybody's late ones and keep the
// capacity up while the backend is overloaded. Here every stream's
// first chunk comes 1.5 s after forwarding (target 1s, breach_share
// 0.5): the share must come down however many such answers come.
func TestAdaptiveDoesNotTimeAQuickTextAnswerToABodyAskingForAStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/metrics" {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = io.WriteString(w, "vllm:num_requests_waiting 12\n")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		time.Sleep(1500 * time.Millisecond) // the backend is overloaded: the prefill waits
		_, _ = io.WriteString(w, "data: {}\n\n")
	}))
	t.Cleanup(upstream.Close)
	const name = "adapt-answerkind-quick-text"
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"permits":8,"max_wait":"60s",
		 "adaptive":{"target_ttft":"1s","min_samples":2,"breach_share":0.5,"interval":"100ms","decrease":0.5,"step":0.25}},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, name, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	loop := func(method, path, body string) {
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}
	}
	for range 2 { // everybody's streams
		wg.Go(func() { loop(http.MethodPost, "/v1/chat/completions", `{"model":"m","stream":true}`) })
	}
	for range 4 { // the client's quick answers
		wg.Go(func() { loop(http.MethodGet, "/metrics", `{"model":"m","stream":true}`) })
	}
	defer func() { cancel(); wg.Wait() }()
	assert.Eventually(t, func() bool { return learnedShare(t, name) < 1 }, 20*time.Second, 50*time.Millisecond,
		"every stream's first chunk came 1.5 s after forwarding (target 1 s), and quick text/plain answers to bodies "+
			"asking for a stream kept the learned share at %v", learnedShare(t, name))
}
