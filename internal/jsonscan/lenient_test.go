package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// vLLM and SGLang read the request with pydantic, which takes a token
// count sent as a string ("100000", " 100000 ", "1_000", "+100",
// "100000.0") for an integer: the backend then generates that many. The
// sniffer reads it as they do, so that a client cannot be weighed light
// by quoting its budget.
func TestSniffReadsATokenCountSentAsAStringAsTheBackendDoes(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		budget     int64
	}{
		{"max_tokens", `{"max_tokens":"100000"}`, 100000},
		{"max_completion_tokens", `{"max_completion_tokens":"2048","max_tokens":1}`, 2048},
		{"spaces around", `{"max_tokens":" 512 "}`, 512},
		{"digits grouped with underscores", `{"max_tokens":"1_000"}`, 1000},
		{"a plus sign", `{"max_tokens":"+100"}`, 100},
		{"a zero fraction", `{"max_tokens":"100000.0"}`, 100000},
		{"not a number", `{"max_tokens":"lots"}`, 0},
		{"negative", `{"max_tokens":"-5"}`, 0},
		{"empty", `{"max_tokens":""}`, 0},
		{"hex is not decimal", `{"max_tokens":"0x10"}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.budget, Sniff([]byte(tc.body)).Budget)
		})
	}
	assert.Equal(t, int64(100000), Sniff([]byte(`{"max_tokens":"100000","max_output_tokens":3}`)).MaxTokens,
		"cost max_tokens charges it too")
}
