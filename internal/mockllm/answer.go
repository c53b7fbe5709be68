package mockllm

import "strings"

// answer is what one completion request is answered with.
type answer struct {
	id      string
	created int64
	model   string
	kind    kind
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
	return map[string]any{
		"id":      a.id,
		"object":  object,
		"created": a.created,
		"model":   a.model,
		"choices": []any{choice},
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
		"usage": map[string]int{
			"prompt_tokens":     0,
			"completion_tokens": tokens,
			"total_tokens":      tokens,
		},
	}
}
