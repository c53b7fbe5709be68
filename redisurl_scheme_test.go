package caddyfairqueue

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Redis URL written as an address (`redis 127.0.0.1:6379`, the way
// redis-cli and most clients take it) was refused with Go's URL parser's
// words, "first path segment in URL cannot contain colon" or "invalid
// URL scheme: localhost", which do not say what to write. The error says
// that the scheme is missing and how to write one, wherever the URL is
// read: the Caddyfile (with its line), the JSON config and the CLI.
func TestARedisURLWithoutSchemeIsRefusedSayingHowToWriteIt(t *testing.T) {
	const want = "redis: invalid url: no scheme: write redis://host:port/db (rediss:// for TLS, unix:///path for a socket)"
	for _, tc := range []struct{ name, body, line string }{
		{"an address", "permits 1\nredis 127.0.0.1:6379", "at Testfile:3"},
		{"a host name and port", "permits 1\nredis localhost:6379", "at Testfile:3"},
		{"in the block", "permits 1\nredis {\nurl 10.0.0.5:6379/0\n}", "at Testfile:4"},
		{"with a password", "permits 1\nredis {\nurl :s3cret@10.0.0.5:6379\n}", "at Testfile:4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), want)
			assert.Contains(t, err.Error(), tc.line)
			assert.NotContains(t, err.Error(), "s3cret")
		})
	}

	t.Setenv("FQ_TEST_SCHEMELESS_URL", "127.0.0.1:6379")
	_, err := newRedisBackend(&RedisConfig{URL: "{env.FQ_TEST_SCHEMELESS_URL}"}, caddy.NewReplacer())
	require.Error(t, err, "JSON, or a placeholder replaced at load")
	assert.Contains(t, err.Error(), want)

	_, err = cliRedis("localhost:6379")
	require.Error(t, err, "caddy fair-queue --redis")
	assert.Contains(t, err.Error(), want)

	for _, ok := range []string{"redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///run/redis.sock"} {
		_, err := parseRedisURL(ok)
		assert.NoError(t, err, ok)
	}
}
