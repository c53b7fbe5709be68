package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSniffCountsThePromptText(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		bytes      int64
		found      bool
	}{
		{"chat messages", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`, 8 + 5, true},
		{"content parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"data:xyz"}},"de"]}]}`, 3 + 2, true},
		{"escapes decoded", `{"messages":[{"content":"a\nb\u00e9\ud83d\ude00"}]}`, 1 + 1 + 1 + 2 + 4, true},
		{"a lone surrogate is U+FFFD", `{"prompt":"\ud800x"}`, 3 + 1, true},
		{"completions prompt", `{"model":"m","prompt":"once upon"}`, 9, true},
		{"a batch of prompts", `{"prompt":["ab","cde",7]}`, 5, true},
		{"Ollama generate: prompt and system", `{"model":"m","prompt":"why","system":"you are terse"}`, 3 + 13, true},
		{"fill in the middle: suffix, and Ollama's template", `{"prompt":"ab","suffix":"cde","template":"{{.Prompt}}"}`, 2 + 3 + 11, true},
		{"Ollama chat", `{"model":"m","messages":[{"role":"user","content":"hi there"}],"options":{"num_predict":8}}`, 8, true},
		{"empty messages", `{"messages":[]}`, 0, true},
		{"roles are not text; tool calls count as their JSON", `{"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]}`, 33, true},
		{"tools and functions count as their JSON", `{"messages":[],"tools":[{"a":1}],"functions":[2]}`, 9 + 3, true},
		{"tools not an array", `{"messages":[],"tools":"xyz"}`, 0, true},
		{"nested prompt keys are not top-level", `{"input":{"prompt":"xx","messages":[{"content":"yy"}]}}`, 0, false},
		{"embeddings input", `{"model":"e","input":"some text"}`, 9, true},
		{"a batch of inputs", `{"model":"e","input":["ab","cd"]}`, 4, true},
		{"Responses API input items", `{"input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]},{"role":"user","content":"hi"}]}`, 7, true},
		{"a refusal part's text", `{"messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]},{"role":"user","content":"ok"}]}`, 2 + 2, true},
		{"input of token ids: no text", `{"input":[1,2,3]}`, 0, true},
		{"no prompt key", `{"model":"m","tools":[]}`, 0, false},
		{"messages not an array", `{"messages":"hello"}`, 0, false},
		{"repeated content: the last", `{"messages":[{"content":"aaaa","content":"b"}]}`, 1, true},
		{"repeated messages: the last", `{"messages":[{"content":"aaaa"}],"messages":[{"content":"bb"}]}`, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Sniff([]byte(tc.body))
			assert.Equal(t, tc.bytes, got.PromptBytes)
			assert.Equal(t, tc.found, got.Prompt)
		})
	}
}

func TestSniffReadsTheCompletionBudget(t *testing.T) {
	for _, tc := range []struct {
		name, body         string
		budget, numPredict int64
	}{
		{"max_completion_tokens first", `{"max_tokens":10,"max_completion_tokens":2000}`, 2000, 0},
		{"max_output_tokens (Responses API)", `{"max_output_tokens":300,"max_tokens":10}`, 300, 0},
		{"max_tokens", `{"max_tokens":77}`, 77, 0},
		{"Ollama's num_predict", `{"options":{"temperature":0,"num_predict":128}}`, 0, 128},
		{"each API's own", `{"max_tokens":5,"options":{"num_predict":128}}`, 5, 128},
		{"num_predict -1 (no limit) is none", `{"options":{"num_predict":-1}}`, 0, 0},
		{"a zero max_completion_tokens is none", `{"max_completion_tokens":0,"max_tokens":9}`, 9, 0},
		{"none", `{"model":"m"}`, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Sniff([]byte(tc.body))
			assert.Equal(t, tc.budget, got.Budget)
			assert.Equal(t, tc.numPredict, got.NumPredict)
		})
	}
}

// FuzzTextLen holds textLen to encoding/json: the length of every JSON
// string once decoded.
func FuzzTextLen(f *testing.F) {
	for _, s := range []string{`""`, `"abc"`, `"\u00e9\n\t\\\/"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83d\u0041"`,
		`"\udc00\ud800"`, "\"\xff\xfe\"", "\"\xed\xa0\x80\"", `"\uD83D\uDE00"`, "\"\xe2\x82\"", `"\ud800\\u"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, tok []byte) {
		var s string
		if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' || !Valid(tok) || json.Unmarshal(tok, &s) != nil {
			return
		}
		assert.Equal(t, int64(len(s)), textLen(tok), "token %q", tok)
	})
}

// BenchmarkSniffPrompt reads a chat body with its prompt's text counted
// (escapes every 32 bytes or so, as prose).
func BenchmarkSniffPrompt(b *testing.B) {
	text := strings.Repeat("Lorem ipsum dolor sit amet, consectetur \\\"adipiscing\\\" elit.\\n", 500)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":256}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if Sniff(body).PromptBytes == 0 {
			b.Fatal("no prompt")
		}
	}
}

// TestSniffCountsTheResponsesAPIsWholePrompt: a Responses API request's
// prompt is its "instructions" (the system message, as Ollama's "system"
// is) and its input items, the tool calls and results among them: a
// function_call_output's "output" is the same text a chat request's
// {"role":"tool","content":...} message holds, and a function_call item
// what a chat request's "tool_calls" hold (each counted as its JSON).
// The backend counts both in usage.input_tokens, from which the queue
// learns its bytes per token.
func TestSniffCountsTheResponsesAPIsWholePrompt(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		bytes      int64
	}{
		{"instructions", `{"model":"m","instructions":"be terse","input":"hi"}`, 8 + 2},
		{"a tool's call and output", `{"model":"m","input":[{"role":"user","content":"read it"},` +
			`{"type":"function_call","call_id":"c1","name":"read","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"c1","output":"file contents"}]}`, 7 + 70 + 13},
		{"the same turn as a chat request", `{"model":"m","messages":[{"role":"user","content":"read it"},` +
			`{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"file contents"}]}`, 7 + 75 + 13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.bytes, Sniff([]byte(tc.body)).PromptBytes)
		})
	}
}

// TestSniffCountsAFillInTheMiddleSuffix: a code completion request to
// Ollama's /api/generate (as editors' autocomplete sends) has the text
// after the cursor in "suffix", often as long as its "prompt": the model
// reads both, and Ollama counts both in prompt_eval_count, from which the
// queue learns its bytes per token.
func TestSniffCountsAFillInTheMiddleSuffix(t *testing.T) {
	body := `{"model":"qwen2.5-coder","prompt":"def add(a, b):\n","suffix":"\n\nprint(add(1, 2))\n","stream":false}`
	assert.Equal(t, int64(15+19), Sniff([]byte(body)).PromptBytes)
}
