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
		// pydantic's lax bool (vLLM, SGLang) streams these; Go refuses
		// the body (Ollama answers 400), so its reading cannot disagree.
		{`{"stream":"true"}`, true, false},
		{`{"stream":1}`, true, false},
		{`{"stream":1.0}`, true, false},
		{`{"stream":1e0}`, true, false},
		{`{"stream":"YES"}`, true, false},
		{`{"stream":"On"}`, true, false},
		{`{"stream":"t"}`, true, false},
		{`{"stream":"y"}`, true, false},
		{`{"stream":"1"}`, true, false},
		{`{"stream":"\u0079es"}`, true, false},
		{`{"stream":1,"STREAM":false}`, true, false},      // Go refuses the 1
		{`{"stream":false,"STREAM":"yes"}`, false, false}, // and the "yes"
		{`{"Stream":"true"}`, false, false},               // pydantic ignores the key, Go refuses the body
		{`{"stream":"false"}`, false, false},
		{`{"stream":0}`, false, false},
		{`{"stream":"off"}`, false, false},
		{`{"stream":2}`, false, false},       // pydantic refuses it (vLLM answers 400)
		{`{"stream":1.5}`, false, false},     // and this
		{`{"stream":" true"}`, false, false}, // and this: no spaces
		{`{"stream":"truE "}`, false, false}, // nor here
		{`{"stream":"ye"}`, false, false},    // nor a prefix
		{`{"stream":[true]}`, false, false},  // nor an array
		{`{"stream":{"a":1}}`, false, false}, // nor an object
	} {
		f := SniffEither([]byte(tc.body))
		assert.Equal(t, tc.stream, f.Stream, "stream of %s", tc.body)
		assert.Equal(t, tc.ambiguous, f.AmbiguousStream, "ambiguous of %s", tc.body)
	}
}

// Reading a "stream" string as pydantic does allocates nothing, escaped
// or not, so that a body repeating "stream":"YES" costs its bytes.
func TestPythonBoolOfAStringAllocatesNothing(t *testing.T) {
	for _, val := range []string{`"YES"`, `"\u0074rue"`, `"\u0066\u0061\u006C\u0073\u0065"`, `"maybe"`, `"\u00ff"`} {
		var v, ok bool
		allocs := testing.AllocsPerRun(100, func() { v, ok = pythonBool([]byte(val)) })
		assert.Zero(t, allocs, "%s", val)
		_, _ = v, ok
	}
	for val, want := range map[string][2]bool{
		`"\u0066\u0061\u006C\u0073\u0065"`: {false, true}, `"\u00ff"`: {false, false}, `"Yes"`: {true, true},
		`"tRuE"`: {true, true}, `"oFF"`: {false, true}, `"1.0"`: {false, false}, `"\u0031"`: {true, true},
		`-0`: {false, true}, `-0.0`: {false, true}, `1e400`: {false, false}, `NaN`: {false, false}, `null`: {false, false},
		`"\u0130"`: {false, false}, // Turkish dotted I: not ASCII
	} {
		v, ok := pythonBool([]byte(val))
		assert.Equal(t, want, [2]bool{v, ok}, "%s", val)
	}
}
