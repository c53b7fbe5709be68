package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Ollama sets num_predict from the float64 Go decodes by truncating it
// (int64(t) in api.Options.FromMap), and generates without limit for a
// num_predict of 0 or less: 0.5 is no limit, 2.9 is 2. SniffFolded reads
// it so: a fraction below 1 sets no budget (the default or learned one
// applies, as for -1). Before, 0.5 was rounded up to a budget of 1
// token, and such a request, which Ollama let run to the end of its
// context, was admitted as if it generated one.
func TestSniffFoldedTruncatesNumPredictAsOllamaDoes(t *testing.T) {
	for body, want := range map[string]int64{
		`{"options":{"num_predict":0.5}}`:    0,
		`{"options":{"num_predict":0.9999}}`: 0,
		`{"options":{"num_predict":1e-300}}`: 0,
		`{"options":{"num_predict":2.9}}`:    2,
		`{"options":{"num_predict":64}}`:     64,
		`{"options":{"num_predict":-0.5}}`:   0,
	} {
		assert.Equal(t, want, SniffFolded([]byte(body)).NumPredict, "%s", body)
	}
}
