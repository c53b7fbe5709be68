package caddyfairqueue

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A redis option given as a placeholder of an unset environment variable
// is replaced by "" at load. check() sees the placeholder, not the
// value, so the config loads: address "" makes go-redis dial its own
// default, localhost:6379 (not the Redis the operator meant, and not
// even the documented default 127.0.0.1:6379), and master_name "" makes
// a Sentinel client that fails at every request. The load should fail
// and name the option, as it does for a URL that expands to "".
func TestRedisOptionsThatExpandToNothingAreRefusedAtLoad(t *testing.T) {
	for _, tc := range []struct {
		cfg    *RedisConfig
		option string
	}{
		{&RedisConfig{Addresses: []string{"{env.FQ_TEST_UNSET_ADDR}"}}, "address"},
		{&RedisConfig{Mode: ModeCluster, Addresses: []string{"{env.FQ_TEST_UNSET_ADDR}"}}, "address"},
		{&RedisConfig{Mode: ModeSentinel, MasterName: "{env.FQ_TEST_UNSET_MASTER}", Addresses: []string{"s1:26379"}}, "master_name"},
		{&RedisConfig{KeyPrefix: "{env.FQ_TEST_UNSET_PREFIX}"}, "key_prefix"},
	} {
		_, err := newRedisBackend(tc.cfg, caddy.NewReplacer())
		if assert.Error(t, err, "%+v", tc.cfg) {
			assert.Contains(t, err.Error(), tc.option)
		}
	}
	_, err := newRedisBackend(&RedisConfig{URL: "{env.FQ_TEST_UNSET_URL}"}, caddy.NewReplacer())
	require.Error(t, err, "a URL that expands to nothing is refused already")
}
