package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An assistant message's reasoning sent back in a conversation counts as
// prompt text (TestWeightCountsAnAssistantMessagesReasoning), but a chat
// template may leave it out (Qwen3's renders only the reasoning after the
// last user message): the answer's usage may not count it, and cannot
// teach the bytes per token of text. A client replaying its reasoning
// leaves the estimate of every client's prompts where it was, not pulled
// up until they are weighed too light (the cache overfilled).
func TestPromptsWithReasoningDoNotTeachThePromptEstimate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-reasoning", KVTokens: 1 << 20, DefaultMaxTokens: 1})
	srv := serve(t, h, proxyTo(t, visionUpstream(t))) // counts the content alone, as such a template renders it
	send := func(messages string) {
		t.Helper()
		resp := srv.post(t, context.Background(), `{"model":"m","max_tokens":1,"messages":[`+messages+`]}`)
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, outcomeGranted, srv.outcome(t))
		settled(t, h)
	}
	text := strings.Repeat("abcd", 1000) // 1000 tokens
	for range 30 {
		send(`{"role":"user","content":"` + text + `"}`)
	}
	e := h.engineList()[0]
	ratio, n := e.kv.state()
	require.Equal(t, int64(30), n)
	require.InDelta(t, 4, ratio, 1e-9)

	for range 200 {
		send(`{"role":"user","content":"` + text + `"},{"role":"assistant","reasoning_content":"` + text + text + `","content":"ok"},{"role":"user","content":"` + text + `"}`)
	}
	ratio, n = e.kv.state()
	t.Logf("bytes per token %.2f from %d answers", ratio, n)
	assert.Equal(t, int64(30), n, "answers to prompts with reasoning are not learned")
	assert.InDelta(t, 4, ratio, 1e-9, "a text prompt is weighed by the text prompts' ratio")
}
