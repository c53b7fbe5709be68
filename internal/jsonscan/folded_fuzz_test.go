package jsonscan

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// ollamaRequest is the oracle of FuzzSniffFoldedAsGo: the fields of
// Ollama's native requests (api.GenerateRequest, api.ChatRequest) that
// SniffFolded reads, as Go's encoding/json decodes them; the others it
// reads are caught, so that the comparison can leave them out.
type ollamaRequest struct {
	Model    string         `json:"model"`
	Prompt   string         `json:"prompt"`
	System   string         `json:"system"`
	Suffix   string         `json:"suffix"`
	Template string         `json:"template"`
	Stream   *bool          `json:"stream"`
	Options  map[string]any `json:"options"`
	Messages []struct {
		Content   string            `json:"content"`
		Thinking  string            `json:"thinking"`
		ToolCalls []json.RawMessage `json:"tool_calls"`
		Images    []json.RawMessage `json:"images"`
	} `json:"messages"`
	// Read by SniffFolded, not compared here.
	Tools        json.RawMessage `json:"tools"`
	Functions    json.RawMessage `json:"functions"`
	Input        json.RawMessage `json:"input"`
	Instructions json.RawMessage `json:"instructions"`
	Context      json.RawMessage `json:"context"`
	Images       json.RawMessage `json:"images"`
}

// FuzzSniffFoldedAsGo: SniffFolded reads a body Ollama's native API
// takes as Ollama reads it (Go's encoding/json into its request
// structs): the model that names the queue, whether it streams, its
// num_predict, and its prompt's text, whatever the keys' spellings,
// repeats and nulls.
func FuzzSniffFoldedAsGo(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"abc","stream":false,"options":{"num_predict":64}}`,
		`{"MODEL":"m","Model":"n","PROMPT":"ab","system":"s"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","Content":"yo"}]}`,
		`{"options":{"num_predict":9},"OPTIONS":{"temperature":1}}`,
		`{"stream":true,"Stream":null}`,
		`{"model":"m","template":"{{ .Prompt }}","suffix":"x","prompt":"p"}`,
		`{"model":"m","Model":null,"prompt":"abc","PROMPT":null,"options":{"num_predict":9},"options":null}`,
		`{"messages":[{"content":"abcd","CONTENT":null}],"system":"s","system":null}`,
		`{"messages":[{"content":"a0"},{"content":"a1"}],"messages":[{}],"Messages":[{},{"content":null}]}`,
		`{"messages":[{"content":"a","Thinking":"tt","thinking":null,"reasoning":"r"}]}`,
		`{"\u006d\u004f\u0064\u0065\u006c":"m","\u004d\u0045\u0053\u0053\u0041\u0047\u0045\u0053":[{"\u0043\u006f\u006e\u0074\u0065\u006e\u0074":"abc"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r ollamaRequest
		if json.Unmarshal(b, &r) != nil {
			return // Ollama answers 400
		}
		got := SniffFolded(b)
		assert.Equal(t, r.Model, got.Model, "model of %q", b)
		assert.Equal(t, r.Stream != nil && *r.Stream, got.Stream, "stream of %q", b)
		assert.Equal(t, r.Stream != nil && !*r.Stream, got.NoStream, "stream of %q", b)
		if v, ok := r.Options["num_predict"]; !ok {
			assert.Zero(t, got.NumPredict, "num_predict of %q", b)
		} else if n, ok := v.(float64); ok && n == math.Trunc(n) && n < MaxTokenCount {
			assert.Equal(t, int64(max(n, 0)), got.NumPredict, "num_predict of %q", b)
		}
		if len(r.Tools)+len(r.Functions)+len(r.Input)+len(r.Instructions)+len(r.Context)+len(r.Images) > 0 {
			return
		}
		// Go decodes a repeated array into the elements of the one
		// before; SniffFolded may count more for it, never less.
		repeated := topLevelKeys(b, "messages") > 1
		text := len(r.Prompt) + len(r.System) + len(r.Suffix) + len(r.Template)
		for _, m := range r.Messages {
			if m.ToolCalls != nil || m.Images != nil {
				return
			}
			text += len(m.Content) + len(m.Thinking)
		}
		switch {
		case !got.Prompt: // the weight counts the whole body
		case repeated:
			assert.GreaterOrEqual(t, got.PromptBytes, int64(text), "prompt text of %q", b)
		default:
			assert.Equal(t, int64(text), got.PromptBytes, "prompt text of %q", b)
		}
	})
}

// topLevelKeys counts the top-level keys of the JSON object b that equal
// name case-insensitively.
func topLevelKeys(b []byte, name string) int {
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return 0
	}
	n := 0
	for d.More() {
		key, err := d.Token()
		if err != nil {
			return n
		}
		if s, ok := key.(string); ok && strings.EqualFold(s, name) {
			n++
		}
		var skip json.RawMessage
		if d.Decode(&skip) != nil {
			return n
		}
	}
	return n
}

// FuzzSniffEitherIsTheHeavierReading checks that SniffEither counts at
// least what each reading counts, and names the exact reading's model.
func FuzzSniffEitherIsTheHeavierReading(f *testing.F) {
	for _, s := range []string{
		`{"model":"a","MODEL":"b","max_tokens":1,"MAX_TOKENS":9}`,
		`{"messages":[{"content":"abcd"}],"messages":[{"role":"user"}],"n":2,"N":3}`,
		`{"Messages":[{"content":"abcd"}],"x":NaN}`, "\ufeff" + `{"prompt":"x"}`, `{"prompt":[1,2,3],"PROMPT":"long text"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		b := []byte(body)
		e, x, g := SniffEither(b), Sniff(b), SniffFolded(b)
		for _, r := range []Fields{x, g} {
			if r == (Fields{}) {
				continue // a body this reader does not read
			}
			if e.Budget < r.Budget || e.MaxTokens < r.MaxTokens || e.Completions < r.Completions ||
				e.PromptTokens < r.PromptTokens || e.PromptBytes < r.PromptBytes || e.Media < r.Media {
				t.Fatalf("SniffEither %+v is lighter than a reading %+v", e, r)
			}
			if r.Prompt && !e.Prompt {
				t.Fatalf("SniffEither %+v lost the prompt of %+v", e, r)
			}
		}
		if x != (Fields{}) && e.Model != x.Model {
			t.Fatalf("SniffEither names %q, the exact reading %q", e.Model, x.Model)
		}
	})
}
