package caddyfairqueue

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A JSON config's error names its field in the JSON's words, once. The
// Caddyfile's wording is added only to the errors a Caddyfile meets at
// load (a placeholder replaced then: TestCaddyfileLoadErrorsNameThe
// CaddyfileOption); the others a Caddyfile meets at adapt, in its own
// words, and never reaches Provision with. Every JSON error read the
// same thing twice ("redis.db: must be >= 0, got -1 (Caddyfile: redis:
// db must be >= 0, got -1)"), to a user who wrote no Caddyfile.
func TestAJSONConfigErrorSaysWhatIsWrongOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for fields, want := range map[string]string{
		`"permits":1,"redis":{"db":-1}`:                                              "redis.db: must be >= 0, got -1",
		`"permits":1,"requeue_on":[429]`:                                             "requeue_on: requires upstreams (a pool to requeue into)",
		`"permits":1,"reject":[{"status":429},{"status":100}]`:                       "reject[1].status: must be 200-599, got 100",
		`"upstreams":[{"dial":"a:1","permits":1},{"dial":"a:1","permits":1}]`:        "upstreams[1].dial: a:1 is listed twice",
		`"permits":1,"redis":{},"reject_stream":{"key":"k","fields":{"reason":"x"}}`: `reject_stream.fields["reason"]: is built in (reason, queue, wait_ms, position, time are)`,
		`"permits":1,"redis":{"url":"bogus://x"}`:                                    "redis.url: invalid url: redis: invalid URL scheme: bogus",
	} {
		err := loadHandlerJSON(t, fields)
		require.Error(t, err, "%s loads", fields)
		_, msg, ok := strings.Cut(err.Error(), "provision http.handlers.fair_queue: ")
		require.True(t, ok, "%s: not refused by Provision: %v", fields, err)
		assert.Equal(t, want, msg, "%s", fields)
	}
}
