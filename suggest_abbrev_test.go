package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An option cut short, as other Redis clients spell it (`addr`, `pass`,
// `user`), is too far from the full name for a typo's edit distance,
// and was refused with no hint. A name that begins exactly one option
// of the block is suggested, in the Caddyfile and in JSON.
func TestAnOptionCutShortSuggestsTheOneItBegins(t *testing.T) {
	for _, tc := range []struct{ name, body, wantErr string }{
		{"addr", "permits 1\nredis {\naddr 127.0.0.1:6379\n}",
			"unrecognized subdirective 'addr' (did you mean 'address'?), at Testfile:4"},
		{"pass", "permits 1\nredis redis://127.0.0.1:6379 {\npass s3cret\n}",
			"unrecognized subdirective 'pass' (did you mean 'password'?), at Testfile:4"},
		{"user", "permits 1\nredis redis://127.0.0.1:6379 {\nuser fq\n}",
			"unrecognized subdirective 'user' (did you mean 'username'?), at Testfile:4"},
		{"a prefix of two options gets no guess", "permits 1\nmax 3",
			"unrecognized subdirective 'max', at Testfile:3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Equal(t, tc.wantErr, err.Error())
		})
	}

	var h Handler
	err := h.UnmarshalJSON([]byte(`{"permits": 1, "redis": {"addr": "127.0.0.1:6379"}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown field "addr" (did you mean "addresses"?)`)
}
