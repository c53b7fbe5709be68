package jsonscan

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Python's json.loads reads a number of any length as its float, correctly
// rounded (1 followed by 5000 zeros and e-5000 is 1.0), and pydantic then
// reads that float as a bool or a token count. Go's strconv.ParseFloat
// keeps only the first 800 digits of a mantissa and loses their place:
// it read that number as 0, so that such a "stream" read as false while
// vLLM streamed it, and such a "max_tokens" as none while vLLM generated
// that many.
func TestSniffReadsANumberWithALongMantissaAsPythonDoes(t *testing.T) {
	zeros := strings.Repeat("0", 5000)
	for _, tc := range []struct {
		name, body string
		want       Fields
	}{
		{"stream 1", `{"stream":1` + zeros + `e-5000}`, Fields{Stream: true}},
		{"stream 1 with a fraction", `{"stream":1` + zeros[:900] + `.0e-900}`, Fields{Stream: true}},
		{"stream 0.99...9, rounded to 1", `{"stream":9` + strings.Repeat("9", 900) + `e-901}`, Fields{Stream: true}},
		{"stream 0", `{"stream":0` + `.` + zeros + `}`, Fields{NoStream: true}},
		{"stream 2", `{"stream":2` + zeros + `e-5000}`, Fields{}},
		{"max_tokens 10000", `{"max_tokens":1` + zeros + `e-4996}`, Fields{MaxTokens: 10000, Budget: 10000}},
		{"n 2", `{"n":2` + zeros[:1000] + `e-1000}`, Fields{Completions: 2}},
		{"max_tokens with a huge exponent", `{"max_tokens":1` + zeros + `e-99999999999999999999}`, Fields{}},
		{"max_tokens past any count", `{"max_tokens":1` + zeros + `e-4000}`, Fields{MaxTokens: MaxTokenCount, Budget: MaxTokenCount}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Sniff([]byte(tc.body)))
			either := SniffEither([]byte(tc.body))
			assert.Equal(t, tc.want.Stream, either.Stream, "SniffEither's stream")
			assert.Equal(t, tc.want.Budget, either.Budget, "SniffEither's budget")
		})
	}
}

// Ollama decodes "options" into a map, each number a float64 as Go's
// strconv.ParseFloat reads it, long mantissa included: SniffFolded's
// num_predict is what Ollama reads, not what Python would.
func TestSniffFoldedReadsALongNumPredictAsOllamaDoes(t *testing.T) {
	zeros := strings.Repeat("0", 5000)
	for _, num := range []string{"1" + zeros + "e-5000", "1" + zeros + "e-4990", "1" + zeros[:1000] + "e-990", "25" + zeros[:900] + "e-900"} {
		body := `{"options":{"num_predict":` + num + `}}`
		var req struct{ Options map[string]any }
		require.NoError(t, json.Unmarshal([]byte(body), &req))
		f := req.Options["num_predict"].(float64)
		want := int64(0) // Ollama truncates it (TestSniffFoldedTruncatesNumPredictAsOllamaDoes)
		if f >= 1 {
			want = int64(math.Trunc(min(f, MaxTokenCount)))
		}
		assert.Equal(t, want, SniffFolded([]byte(body)).NumPredict, "num_predict %.20s… (Go reads %v)", num, f)
	}
}
