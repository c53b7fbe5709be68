package caddyfairqueue

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokenizingUpstream answers a chat request with the usage of a
// tokenizer that merges a run of 16 spaces into one token, counts a digit
// or a comma as one, and anything else at 4 bytes per token: padding of
// spaces and lists of numbers are text whose ratio a client chooses.
func tokenizingUpstream(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("upstream: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var spaces, digits, other int
		for _, m := range body.Messages {
			for _, c := range []byte(m.Content) {
				switch {
				case c == ' ':
					spaces++
				case c == ',' || c >= '0' && c <= '9':
					digits++
				default:
					other++
				}
			}
		}
		prompt := (spaces+15)/16 + digits + (other+3)/4
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`, prompt, prompt+1)
	})
}

// One client's answer cannot swing the bytes per token that weighs every
// client's prompt: a single huge prompt of text that tokenizes unusually
// (spaces 16 bytes to a token, numbers 1 byte to a token) moves the
// estimate only part of the way, so that the next ordinary prompt is
// still weighed within half again of its tokens, not at a third of them
// (the queue then admits three times what the cache holds) or at three
// times them (two thirds of the capacity idle).
func TestOneHugePromptCannotSwingThePromptEstimate(t *testing.T) {
	const honestText = 4000 // bytes, 1000 tokens
	for _, tc := range []struct {
		name, hostile string
	}{
		{"padded with spaces", strings.Repeat(" ", 512<<10)}, // 32,768 tokens, 16 bytes each
		{"a list of numbers", strings.Repeat("1,", 50000)},   // 100,000 tokens, 1 byte each
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			h := provisionLocal(t, newContext(t), &Handler{Name: "kv-skew", KVTokens: 1 << 20, DefaultMaxTokens: 1})
			srv := serve(t, h, proxyTo(t, tokenizingUpstream(t)))
			send := func(text string) {
				t.Helper()
				resp := srv.post(t, context.Background(), `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"`+text+`"}]}`)
				_, _ = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, outcomeGranted, srv.outcome(t))
				settled(t, h)
			}
			for range 30 {
				send(strings.Repeat("abcd", honestText/4))
			}
			e := h.engineList()[0]
			ratio, n := e.kv.state()
			require.Equal(t, int64(30), n)
			require.InDelta(t, 4, ratio, 1e-9, "the honest prompts' ratio")

			send(tc.hostile)
			ratio, n = e.kv.state()
			require.Equal(t, int64(31), n, "the hostile answer is a sample within the bounds")
			estimate := math.Ceil(honestText / ratio)
			t.Logf("bytes per token %.2f: an honest prompt of 1000 tokens is weighed %.0f", ratio, estimate)
			assert.GreaterOrEqual(t, estimate, 1000/1.5, "weighed far too light: the queue admits more than the cache holds")
			assert.LessOrEqual(t, estimate, 1000*1.5, "weighed far too heavy: capacity idles")
		})
	}
}
