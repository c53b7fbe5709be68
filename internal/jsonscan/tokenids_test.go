package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSniffCountsThePromptsTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Fields
	}{
		{"a prompt of ids", `{"prompt":[1,2,3]}`, Fields{Prompt: true, PromptTokens: 3}},
		{"a batch of id prompts", `{"prompt":[[1,2],[3]]}`, Fields{Prompt: true, PromptTokens: 3, Completions: 2}},
		{"embeddings input of ids", `{"input":[[1,2],[3,4,5]]}`, Fields{Prompt: true, PromptTokens: 5}},
		{"embeddings input, one of ids", `{"input":[7,8]}`, Fields{Prompt: true, PromptTokens: 2}},
		{"Ollama context beside a prompt", `{"prompt":"ab","context":[1,2,3,4]}`, Fields{Prompt: true, PromptBytes: 2, PromptTokens: 4}},
		{"Ollama context alone names no prompt", `{"context":[1,2]}`, Fields{PromptTokens: 2}},
		{"text is not ids", `{"prompt":["ab"],"input":"cd"}`, Fields{Prompt: true, PromptBytes: 4, Completions: 1}},
		{"deeper arrays are not ids", `{"prompt":[[[1,2]]]}`, Fields{Prompt: true, Completions: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Sniff([]byte(tc.body)))
		})
	}
}

// wantPromptTokens is the fuzz oracle's reading of Fields.PromptTokens.
func wantPromptTokens(m map[string]json.RawMessage) int64 {
	numbers := func(raw json.RawMessage) int64 {
		var n int64
		els, _ := wantArray(raw)
		for _, el := range els {
			var f json.Number
			if el = bytes.TrimSpace(el); el[0] != '"' && json.Unmarshal(el, &f) == nil && f != "" {
				n++
			}
		}
		return n
	}
	ids := numbers(m["context"])
	for _, key := range []string{"prompt", "input", "input_ids"} {
		ids += numbers(m[key])
		els, _ := wantArray(m[key])
		for _, el := range els {
			ids += numbers(el)
		}
	}
	return ids
}
