package caddyfairqueue

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// visionUpstream answers a chat request with the usage of a vision
// model: 4 bytes of text per token, and 1500 tokens per image part, whose
// bytes the prompt's text does not hold.
func visionUpstream(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("upstream: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		prompt := 0
		for _, m := range body.Messages {
			var text string
			var parts []struct{ Type, Text string }
			if json.Unmarshal(m.Content, &text) != nil {
				if err := json.Unmarshal(m.Content, &parts); err != nil {
					t.Errorf("upstream: %v", err)
				}
			}
			prompt += (len(text) + 3) / 4
			for _, p := range parts {
				if p.Type == "text" {
					prompt += (len(p.Text) + 3) / 4
				} else {
					prompt += 1500
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`, prompt, prompt+1)
	})
}

// A prompt with an image (or audio) is counted by the backend with the
// media's tokens, which its text does not show: its answer cannot teach
// the bytes per token of text, as a prompt sent as token ids cannot. A
// client sending pictures with a caption leaves the estimate of every
// client's text prompts where it was, not pulled down until they are
// weighed half again too heavy (capacity idle).
func TestPromptsWithMediaDoNotTeachThePromptEstimate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-media", KVTokens: 1 << 20, DefaultMaxTokens: 1})
	srv := serve(t, h, proxyTo(t, visionUpstream(t)))
	send := func(content string) {
		t.Helper()
		resp := srv.post(t, context.Background(), `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":`+content+`}]}`)
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, outcomeGranted, srv.outcome(t))
		settled(t, h)
	}
	text := strings.Repeat("abcd", 1000) // 1000 tokens
	for range 30 {
		send(`"` + text + `"`)
	}
	e := h.engineList()[0]
	ratio, n := e.kv.state()
	require.Equal(t, int64(30), n)
	require.InDelta(t, 4, ratio, 1e-9)

	for range 200 {
		send(`[{"type":"text","text":"` + text + `"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]`)
	}
	ratio, n = e.kv.state()
	t.Logf("bytes per token %.2f from %d answers", ratio, n)
	assert.Equal(t, int64(30), n, "answers to prompts with an image are not learned")
	assert.InDelta(t, 4, ratio, 1e-9, "a text prompt is weighed by the text prompts' ratio")
}
