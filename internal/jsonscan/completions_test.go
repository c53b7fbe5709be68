package jsonscan

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSniffCountsTheCompletions(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"none named", `{"messages":[]}`, 0},
		{"n", `{"n":8}`, 8},
		{"n as a string", `{"n":"8"}`, 8},
		{"n zero or negative is one", `{"n":0,"best_of":-2,"messages":[]}`, 0},
		{"best_of above n", `{"n":2,"best_of":5}`, 5},
		{"n above best_of", `{"n":6,"best_of":5}`, 6},
		{"a batch of strings", `{"prompt":["a","b","c"]}`, 3},
		{"a batch of token arrays", `{"prompt":[[1,2],[3]]}`, 2},
		{"one prompt of tokens", `{"prompt":[1,2,3]}`, 0},
		{"a batch, n each", `{"prompt":["a","b"],"n":3}`, 6},
		{"duplicate n: the last", `{"n":64,"n":1}`, 1},
		{"nested is ignored", `{"options":{"n":5},"input":["a","b"]}`, 0},
		{"saturated", `{"n":1e300,"prompt":["a","b"]}`, MaxTokenCount},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Sniff([]byte(tc.body)).Completions)
		})
	}
}

// wantCompletions is the fuzz oracle's reading of Fields.Completions.
func wantCompletions(m map[string]json.RawMessage) int64 {
	each := max(wantTokens(m["n"]), wantTokens(m["best_of"]))
	var batch int64
	if prompts, ok := wantArray(m["prompt"]); ok {
		for _, p := range prompts {
			if _, ok := wantString(p); ok {
				batch++
			} else if _, ok := wantArray(p); ok {
				batch++
			}
		}
	}
	if each == 0 && batch == 0 {
		return 0
	}
	each, batch = max(each, 1), max(batch, 1)
	if float64(each)*float64(batch) >= MaxTokenCount {
		return MaxTokenCount
	}
	return each * batch
}
