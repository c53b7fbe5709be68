package mockllm

import "strings"

// answer is what one completion request is answered with.
type answer struct {
	id      string
	created int64
	model   string
	kind    kind
	// promptTokens is the usage's prompt_tokens: the request body's size
	// in bytes / 4, rounded up.
	promptTokens int
	// includeUsage: "stream_options":{"include_usage":true} was asked.
	includeUsage bool
}

const token = "tok "

// chunk returns the streamed event of one token.
func (a answer) chunk(last bool) map[string]any {
	var finish any
	if last {
		finish = "stop"
	}
	choice := map[string]any{"index": 0, "finish_reason": finish}
	object := "text_completion"
	if a.kind == chatKind {
		object = "chat.completion.chunk"
		choice["delta"] = map[string]string{"content": token}
	} else {
		choice["text"] = token
	}
	c := map[string]any{
		"id":      a.id,
		"object":  object,
		"created": a.created,
		"model":   a.model,
		"choices": []any{choice},
	}
	if a.includeUsage {
		c["usage"] = nil // as OpenAI: null in every chunk but the usage chunk
	}
	return c
}

// usageChunk returns the streamed event that follows the last token when
// the request asked for include_usage: no choices, the usage of tokens
// tokens.
func (a answer) usageChunk(tokens int) map[string]any {
	object := "text_completion"
	if a.kind == chatKind {
		object = "chat.completion.chunk"
	}
	return map[string]any{
		"id":      a.id,
		"object":  object,
		"created": a.created,
		"model":   a.model,
		"choices": []any{},
		"usage":   a.usage(tokens),
	}
}

// usage is the OpenAI usage object of an answer of tokens tokens.
func (a answer) usage(tokens int) map[string]int {
	return map[string]int{
		"prompt_tokens":     a.promptTokens,
		"completion_tokens": tokens,
		"total_tokens":      a.promptTokens + tokens,
	}
}

// whole returns the unstreamed answer of tokens tokens.
func (a answer) whole(tokens int) map[string]any {
	text := strings.Repeat(token, tokens)
	choice := map[string]any{"index": 0, "finish_reason": "stop"}
	object := "text_completion"
	if a.kind == chatKind {
		object = "chat.completion"
		choice["message"] = map[string]string{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	return map[string]any{
		"id":      a.id,
		"object":  object,
		"created": a.created,
		"model":   a.model,
		"choices": []any{choice},
		"usage":   a.usage(tokens),
	}
}
