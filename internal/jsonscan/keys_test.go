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
