package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Redis timeout is a duration; in JSON a bare number is nanoseconds,
// as every Caddy duration: "read_timeout": 500, meant as 500ms, loaded
// as 500ns, and with a Redis that answers every request met
// on_store_error (fail_closed: 503 store_unavailable, fail_open: no
// queue at all). The Caddyfile took "500ns" and "500us" as well. A
// timeout below 1ms is refused in both forms, naming the option.
func TestRedisTimeoutsBelowAMillisecondAreRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct{ fields, want string }{
		{`"permits":1,"redis":{"read_timeout":500}`, "redis.read_timeout: must be at least 1ms, got 500ns"},
		{`"permits":1,"redis":{"dial_timeout":"200us"}`, "redis.dial_timeout: must be at least 1ms, got 200µs"},
		{`"permits":1,"redis":{"write_timeout":1}`, "redis.write_timeout: must be at least 1ms, got 1ns"},
	} {
		err := loadHandlerJSON(t, tc.fields)
		if assert.Error(t, err, "%s loads", tc.fields) {
			assert.Contains(t, err.Error(), tc.want)
		}
	}
	for _, tc := range []struct{ option, want string }{
		{"read_timeout 500ns", "read_timeout must be at least 1ms, got 500ns"},
		{"dial_timeout 200us", "dial_timeout must be at least 1ms, got 200us"},
	} {
		_, err := parse("fair_queue {\npermits 1\nredis {\n" + tc.option + "\n}\n}")
		if assert.Error(t, err, "%s parses", tc.option) {
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "Testfile:4", "the option's line")
		}
	}
	// 1ms and up load, in both forms.
	require.NoError(t, loadHandlerJSON(t, `"permits":1,"redis":{"read_timeout":"1ms","dial_timeout":1000000}`))
	_, err := parse("fair_queue {\npermits 1\nredis {\nread_timeout 1ms\n}\n}")
	require.NoError(t, err)
}
