package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An option written in the wrong block (adaptive's target_ttft at the
// top of fair_queue, the queue's kv_tokens inside redis) is refused, and
// the error says which block it belongs to: "unrecognized subdirective"
// alone reads as a misspelling, and the option is spelt right.
func TestCaddyfileOptionInTheWrongBlockNamesItsBlock(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"adaptive's option at the top", "permits 2\ntarget_ttft 2s",
			"unrecognized subdirective 'target_ttft' (an option of the adaptive block), at Testfile:3"},
		{"adaptive's backend_metrics at the top", "permits 2\nbackend_metrics http://127.0.0.1:8000/metrics",
			"unrecognized subdirective 'backend_metrics' (an option of the adaptive block), at Testfile:3"},
		{"the queue's option in redis", "permits 2\nredis {\nurl redis://127.0.0.1:6379\nkv_tokens 1000\n}",
			"unrecognized subdirective 'kv_tokens' (an option of fair_queue itself, not of this block), at Testfile:5"},
		{"the queue's option in adaptive", "permits 2\nadaptive {\ntarget_ttft 2s\nmax_wait 5s\n}",
			"unrecognized subdirective 'max_wait' (an option of fair_queue itself, not of this block), at Testfile:5"},
		{"redis's option at the top", "permits 2\nkey_prefix prod",
			"unrecognized subdirective 'key_prefix' (an option of the redis block), at Testfile:3"},
		{"reject's option at the top", "permits 2\nretry_after 5s",
			"unrecognized subdirective 'retry_after' (an option of the reject block), at Testfile:3"},
		{"reject_stream's option in reject", "permits 2\nreject {\nmaxlen 10\n}",
			"unrecognized subdirective 'maxlen' (an option of the reject_stream block), at Testfile:4"},
		{"a typo still gets its suggestion", "permits 2\nadaptive {\ntarget_tfft 2s\n}",
			"unrecognized subdirective 'target_tfft' (did you mean 'target_ttft'?), at Testfile:4"},
		{"a name of no block gets no hint", "permits 2\nbogus 1",
			"unrecognized subdirective 'bogus', at Testfile:3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Equal(t, tc.wantErr, err.Error())
		})
	}
}

// Each block takes the options optionBlocks lists for it: a listed
// option is never refused as unknown in its own block (its argument,
// here a dummy, may still be refused).
func TestCaddyfileOptionBlocksTakeTheirOptions(t *testing.T) {
	wrap := map[string]func(string) string{
		"":              func(o string) string { return "fair_queue {\n" + o + "\n}" },
		"adaptive":      func(o string) string { return "fair_queue {\npermits 1\nadaptive {\n" + o + "\n}\n}" },
		"redis":         func(o string) string { return "fair_queue {\npermits 1\nredis {\n" + o + "\n}\n}" },
		"reject":        func(o string) string { return "fair_queue {\npermits 1\nreject {\n" + o + "\n}\n}" },
		"reject_stream": func(o string) string { return "fair_queue {\npermits 1\nredis\nreject_stream k {\n" + o + "\n}\n}" },
	}
	for opt, block := range optionBlocks {
		_, err := parse(wrap[block](opt + " x y"))
		if err != nil {
			assert.NotContains(t, err.Error(), "unrecognized subdirective '"+opt+"'", "block %q", block)
		}
	}
}
