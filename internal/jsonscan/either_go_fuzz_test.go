package jsonscan

import (
	"encoding/json"
	"testing"
)

// ollamaOpenAIRequest is the oracle of FuzzSniffEitherAsOllamaV1: the
// fields of Ollama's OpenAI-compatible requests (its openai package's
// ChatCompletionRequest, CompletionRequest and EmbedRequest) that
// SniffEither weighs, as Go's encoding/json decodes them.
type ollamaOpenAIRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Content   any               `json:"content"`
		ToolCalls []json.RawMessage `json:"tool_calls"`
	} `json:"messages"`
	MaxTokens *int   `json:"max_tokens"`
	Prompt    string `json:"prompt"`
	Suffix    string `json:"suffix"`
	Input     any    `json:"input"`
	// Read by SniffEither, not compared here.
	Tools json.RawMessage `json:"tools"`
}

// FuzzSniffEitherAsOllamaV1: a body Ollama's /v1 endpoints take is never
// weighed lighter by SniffEither than Ollama runs it (its max_tokens,
// its prompt's text), and names Ollama's model unless it is refused as
// ambiguous, whatever the keys' spellings (Unicode folding: the Kelvin
// sign is k, the long s is s), escapes, repeats and nulls.
func FuzzSniffEitherAsOllamaV1(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"abc"}],"max_tokens":64,"stream":true}`,
		`{"model":"m","max_to\u212Aens":100000,"messages":[]}`,
		"{\"model\":\"m\",\"max_to\u212aens\":100000,\"messages\":[]}",
		`{"model":"m","\u017Ftream":true,"me\u017F\u017Fages":[{"content":"abcd"}]}`,
		`{"modeL":"big","model":"small"}`,
		`{"model":"m","stream":false,"STREAM":true}`,
		`{"model":"m","stream":true,"\u017Ftream":false,"stream":null}`,
		`{"model":"m","input":"a","stream":true,"STREAM":null}`,
		`{"mod\u0065l":"m","MAX_TOKENS":7}`,
		`{"model":"m","prompt":"abc","Suffix":"defg","max_tokens":1,"MAX_TOKENS":9}`,
		`{"model":"m","input":"abc","INPUT":"abcdef"}`,
		`{"model":"m","messages":[{"content":[{"type":"text","text":"abc"}]}],"Messages":[{}]}`,
		`{"model":"m","model":null,"messages":[{"content":"a"}],"messages":null}`,
		"{\"model\":\"m\xff\",\"messages\":[{\"content\":\"\xfe\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r ollamaOpenAIRequest
		if json.Unmarshal(b, &r) != nil {
			return // Ollama answers 400
		}
		got := SniffEither(b)
		if !got.Ambiguous && got.Model != r.Model {
			t.Fatalf("SniffEither names %q, Ollama runs %q, of %q", got.Model, r.Model, b)
		}
		if !got.AmbiguousStream && got.Stream != r.Stream {
			t.Fatalf("SniffEither reads stream %v, Ollama %v, of %q", got.Stream, r.Stream, b)
		}
		var responses struct {
			Stream *bool `json:"stream"` // Ollama's /v1/responses: a null unsets it
		}
		if json.Unmarshal(b, &responses) == nil && !got.AmbiguousStream && got.Stream != (responses.Stream != nil && *responses.Stream) {
			t.Fatalf("SniffEither reads stream %v, Ollama's /v1/responses %v, of %q", got.Stream, responses.Stream != nil && *responses.Stream, b)
		}
		if r.MaxTokens != nil && *r.MaxTokens > 0 && (got.MaxTokens < int64(*r.MaxTokens) || got.Budget < int64(*r.MaxTokens)) {
			t.Fatalf("SniffEither %+v is lighter than Ollama's max_tokens %d, of %q", got, *r.MaxTokens, b)
		}
		if r.Tools != nil {
			return
		}
		text := len(r.Prompt) + len(r.Suffix)
		if s, ok := r.Input.(string); ok {
			text += len(s)
		}
		for _, m := range r.Messages {
			if m.ToolCalls != nil {
				return
			}
			switch c := m.Content.(type) {
			case string:
				text += len(c)
			case []any:
				for _, p := range c {
					if part, ok := p.(map[string]any); ok {
						if s, ok := part["text"].(string); ok {
							text += len(s)
						}
					}
				}
			}
		}
		// Without a prompt found, the weight counts the whole body.
		if got.Prompt && got.PromptBytes < int64(text) {
			t.Fatalf("SniffEither counts %d bytes of prompt, Ollama runs %d, of %q", got.PromptBytes, text, b)
		}
	})
}
