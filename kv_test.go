package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func TestCaddyfileParsesTheTokenOptions(t *testing.T) {
	h, err := parse("fair_queue {\nkv_tokens 200000\ndefault_max_tokens 512\n}")
	require.NoError(t, err, "kv_tokens alone bounds a queue: permits may be left out")
	assert.Equal(t, 200000, h.KVTokens)
	assert.Equal(t, 512, h.DefaultMaxTokens)
	assert.Equal(t, "kv_tokens (1 and 2)", (&Handler{KVTokens: 1}).settings().diff((&Handler{KVTokens: 2}).settings()))

	h, err = parse("fair_queue {\nupstream a:1 4 kv_tokens 1000\nupstream b:1 2 kv_tokens 500\n}")
	require.NoError(t, err)
	assert.Equal(t, []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 1000}, {Dial: "b:1", Permits: 2, KVTokens: 500}}, h.Upstreams)
	assert.True(t, h.countsTokens())
	w, clamped := h.settings().config().ClampTokens(5000)
	assert.Equal(t, 1000, w, "a request heavier than every replica is clamped to the largest")
	assert.True(t, clamped)

	h, err = parse("fair_queue {\npermits 2\n}")
	require.NoError(t, err)
	assert.False(t, h.countsTokens())
	assert.Equal(t, DefaultMaxTokens, h.defaultMaxTokens())
}

func TestCaddyfileRefusesBadTokenOptionsNamingTheLine(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"kv_tokens zero", "kv_tokens 0", "kv_tokens must be at least 1, got 0"},
		{"kv_tokens not a number", "kv_tokens lots", "kv_tokens: 'lots' is not an integer"},
		{"kv_tokens twice", "kv_tokens 1\nkv_tokens 2", "subdirective 'kv_tokens' is given twice"},
		{"default_max_tokens zero", "kv_tokens 10\ndefault_max_tokens 0", "default_max_tokens must be at least 1, got 0"},
		{"default_max_tokens without tokens", "permits 1\ndefault_max_tokens 10", "default_max_tokens requires kv_tokens (on the queue or an upstream) or cost tokens"},
		{"upstream kv_tokens zero", "upstream a:1 1 kv_tokens 0", "upstream a:1: kv_tokens must be at least 1, got 0"},
		{"upstream kv_tokens not a number", "upstream a:1 1 kv_tokens many", "upstream a:1: kv_tokens 'many' is not an integer"},
		{"upstream unknown option", "upstream a:1 1 tokens 5", "upstream a:1: unknown option 'tokens' (want kv_tokens)"},
		{"upstream kv_tokens without value", "upstream a:1 1 kv_tokens", "wrong argument count"},
		{"kv_tokens on some upstreams", "upstream a:1 1 kv_tokens 10\nupstream b:1 1", "kv_tokens is set on 1 of the 2 upstreams"},
		{"kv_tokens above the pool", "kv_tokens 30\nupstream a:1 1 kv_tokens 10\nupstream b:1 1 kv_tokens 10", "kv_tokens (30) is more than the upstreams' kv_tokens together (20)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
		})
	}
	// Some upstreams with kv_tokens and the queue's own: each counts.
	_, err := parse("fair_queue {\nkv_tokens 15\nupstream a:1 1 kv_tokens 10\nupstream b:1 1\n}")
	require.NoError(t, err)
}

func TestJSONConfigErrorsOfTheTokenOptionsNameTheField(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"kv_tokens negative", `"permits":1,"kv_tokens":-1`, `kv_tokens must be >= 0, got -1`},
		{"kv_tokens a string", `"kv_tokens":"many"`, `kv_tokens: want an integer, got a string`},
		{"upstream kv_tokens negative", `"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":-5}]`, `upstreams[0] (a:1): kv_tokens must be >= 0, got -5`},
		{"upstream kv_tokens a string", `"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":"x"}]`, `upstreams[0].kv_tokens: want an integer, got a string`},
		{"default_max_tokens negative", `"kv_tokens":10,"default_max_tokens":-1`, `default_max_tokens must be at least 1, got -1`},
		{"default_max_tokens typo", `"kv_tokens":10,"default_max_token":5`, `(did you mean "default_max_tokens"?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	require.NoError(t, loadHandlerJSON(t, `"kv_tokens":100000,"default_max_tokens":256`))
}
