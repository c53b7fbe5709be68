package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSniffFoldedReadsKeysAsGoDoes(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Fields
	}{
		{"another spelling of a key", `{"MODEL":"m","Stream":false,"Prompt":"abc"}`, Fields{Model: "m", NoStream: true, PromptBytes: 3, Prompt: true}},
		{"the last spelling counts", `{"prompt":"abcdef","PROMPT":"ab"}`, Fields{PromptBytes: 2, Prompt: true}},
		{"message keys", `{"Messages":[{"CONTENT":"abcd","content":"x","Tool_Calls":[1]}]}`, Fields{PromptBytes: 1 + 3, Prompt: true}},
		{"Unicode folding: the Kelvin sign", "{\"max_to\u212aens\":7,\"model\":\"m\"}", Fields{Model: "m", MaxTokens: 7, Budget: 7}},
		{"options merge: num_predict stays", `{"options":{"num_predict":9},"OPTIONS":{"temperature":1}}`, Fields{NumPredict: 9}},
		{"options merge: num_predict replaced", `{"options":{"num_predict":9},"Options":{"num_predict":300}}`, Fields{NumPredict: 300}},
		{"options keys are exact", `{"options":{"NUM_PREDICT":9}}`, Fields{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, SniffFolded([]byte(tc.body)))
		})
	}
	// Sniff reads keys exactly, as pydantic does.
	assert.Equal(t, Fields{PromptBytes: 6, Prompt: true}, Sniff([]byte(`{"prompt":"abcdef","PROMPT":"ab"}`)))
	assert.Equal(t, Fields{}, Sniff([]byte(`{"options":{"num_predict":9},"OPTIONS":{"temperature":1},"options":{}}`)))
}

// Go's encoding/json, with which Ollama reads its native API's body,
// decodes a null into a string as nothing at all (the value before it
// stands) and into a map as none: a client that sends its prompt, a
// message's content or its model again as null still has Ollama run
// them, and one that sends its options again as null has no num_predict.
// SniffFolded reads them so, or a client is weighed light: its prompt
// uncounted, its budget one it does not have.
func TestSniffFoldedReadsANullAsGoDoes(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Fields
	}{
		{"a prompt, then null", `{"model":"m","system":"","prompt":"abcdef","prompt":null}`, Fields{Model: "m", PromptBytes: 6, Prompt: true}},
		{"a message's content, then null", `{"messages":[{"role":"user","content":"abcd","Content":null}]}`, Fields{PromptBytes: 4, Prompt: true}},
		{"system, template and suffix, then null", `{"system":"ab","template":"cd","suffix":"ef","prompt":"","SYSTEM":null,"template":null,"Suffix":null}`, Fields{PromptBytes: 6, Prompt: true}},
		{"a model, then null", `{"model":"llama3","Model":null,"prompt":"x"}`, Fields{Model: "llama3", PromptBytes: 1, Prompt: true}},
		{"options, then null", `{"options":{"num_predict":9},"options":null}`, Fields{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, SniffFolded([]byte(tc.body)))
		})
	}
	// pydantic (vLLM, SGLang) takes the last value, null included.
	assert.Equal(t, Fields{}, Sniff([]byte(`{"prompt":"abcdef","prompt":null,"model":"m","model":null}`)))
}
