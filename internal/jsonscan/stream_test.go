package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// SniffEither's Stream is the exact reading's (vLLM, SGLang); a body
// that Ollama's /v1 endpoints (Go's encoding/json into a bool: keys in
// any case, the last spelling winning; a null leaves the value before it
// in the bool of /v1/chat/completions and /v1/completions, and unsets
// the *bool of /v1/responses) read as streaming where it does not, or
// the other way round, is AmbiguousStream.
func TestSniffEitherTellsAStreamThatReadsTwoWays(t *testing.T) {
	for _, tc := range []struct {
		body              string
		stream, ambiguous bool
	}{
		{`{"stream":true}`, true, false},
		{`{"stream":false,"STREAM":false}`, false, false},
		{`{"stream":false,"STREAM":true}`, false, true},
		{`{"stream":true,"Stream":false}`, true, true},
		{`{"Stream":true}`, false, true},
		{`{"\u017Ftream":true}`, false, true}, // the long s folds to s
		{`{"stream":true,"stream":null}`, false, true},
		{`{"stream":true,"STREAM":null}`, true, true}, // Ollama's /v1/responses: a *bool, which the null unsets
		{`{"stream":false,"STREAM":null}`, false, false},
		{`{"stream":null}`, false, false},
		{`{"stream":"true"}`, false, false}, // Go refuses it; pydantic's lax bool is not read
	} {
		f := SniffEither([]byte(tc.body))
		assert.Equal(t, tc.stream, f.Stream, "stream of %s", tc.body)
		assert.Equal(t, tc.ambiguous, f.AmbiguousStream, "ambiguous of %s", tc.body)
	}
}
