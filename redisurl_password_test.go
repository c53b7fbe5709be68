package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Redis URL whose password holds a '/', '?', '#' or '@' not
// percent-encoded does not parse as the operator meant: the password
// ends early, and what follows it reads as the port, the path (the db)
// or the query. The error (in Caddy's log, and in the admin API's answer
// to the POST /load that carried it) never quotes that part of the
// password, from the config or from an {env.*} placeholder, and says
// how to write it. An error of a URL without a password keeps its words.
func TestARedisURLThatDoesNotParseNeverQuotesItsPassword(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	t.Setenv("FQ_TEST_PW", "s3cr/et9x")
	for _, tc := range []struct{ url, secret string }{
		{"redis://:{env.FQ_TEST_PW}@h:1", "s3cr"},
		{"redis://u:s3cr/et9x@h:1", "s3cr"},
		{"redis://u:s3cr#et9x@h:1", "s3cr"},
		{"redis://u:s3cr?et9x@h:1", "s3cr"},
		{"redis://u:s3cr@et9x/pa55w0rd@h:1", "pa55w0rd"},
		{"redis://u:s3cr@et9x/pa/55w0rd@h:1", "55w0rd"},
	} {
		err := loadHandlerJSON(t, `"permits":1,"redis":{"url":"`+tc.url+`"}`)
		require.Error(t, err, tc.url)
		assert.Contains(t, err.Error(), "redis.url: invalid url", tc.url)
		assert.NotContains(t, err.Error(), tc.secret, "%s: the password is quoted", tc.url)
		assert.Contains(t, err.Error(), "percent-encode", tc.url)
	}
	err := loadHandlerJSON(t, `"permits":1,"redis":{"url":"redis://h:1/zz"}`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `redis.url: invalid url: redis: invalid database number: "zz"`)
}
