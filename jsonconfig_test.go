package caddyfairqueue

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadHandlerJSON validates a config whose one route holds the handler
// JSON fields given, as `caddy validate` and POST /load decode it.
func loadHandlerJSON(t *testing.T, fields string) error {
	t.Helper()
	raw := `{"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[
		{"handler":"fair_queue",` + fields + `}]}]}}}}}`
	var cfg caddy.Config
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	return caddy.Validate(&cfg)
}

func TestJSONConfigErrorsNameTheFieldAndSuggestTheNearestOption(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"bad duration", `"permits":1,"max_wait":"abc"`, `max_wait: invalid duration "abc"`},
		{"wrong type", `"permits":"many"`, `permits: want an integer, got a string`},
		{"fraction", `"permits":1.5`, `permits: want an integer, got a number 1.5`},
		{"nested duration", `"permits":1,"redis":{"dial_timeout":"x"}`, `redis.dial_timeout: invalid duration "x"`},
		{"nested wrong type", `"permits":1,"redis":{"addresses":"a:1"}`, `redis.addresses: want a list, got a string`},
		{"list element", `"permits":1,"reject":[{"status":200},{"status":"x"}]`, `reject[1].status: want an integer, got a string`},
		{"typo", `"permit":1`, `unknown field "permit" (did you mean "permits"?)`},
		{"nested typo", `"permits":1,"redis":{"adresses":["a:1"]}`, `redis: unknown field "adresses" (did you mean "addresses"?)`},
		{"nothing near", `"permits":1,"colour":"red"`, `unknown field "colour"`},
		{"map value", `"permits":1,"tenant":"t","weights":{"secret-key":"x"}`, `weights: want a number, got a string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "secret-key", "a map key (a tenant's value) is never echoed")
		})
	}
	err := loadHandlerJSON(t, `"permits":1,"colour":"red"`)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "did you mean", "no suggestion when no option is near")
}

func TestJSONConfigStillDecodesAndRefusesUnknownFields(t *testing.T) {
	var h Handler
	require.NoError(t, json.Unmarshal([]byte(`{"permits":2,"max_wait":"3s","redis":{"addresses":["a:1"]},"weights":{"k":2}}`), &h))
	assert.Equal(t, 2, h.Permits)
	assert.Equal(t, caddy.Duration(3e9), h.MaxWait)
	assert.Equal(t, []string{"a:1"}, h.Redis.Addresses)
	assert.Equal(t, 2.0, h.Weights["k"])
	err := json.Unmarshal([]byte(`{"permits":2,"Bogus":1}`), &h)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), `unknown field "Bogus"`), err.Error())
}

func TestCaddyfileSuggestsTheNearestOptionForATypo(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"handler option", "permit 1", "unrecognized subdirective 'permit' (did you mean 'permits'?)"},
		{"redis option", "permits 1\nredis {\nadress a:1\n}", "unrecognized subdirective 'adress' (did you mean 'address'?)"},
		{"reject option", "permits 1\nreject {\nstatuss 500\n}", "unrecognized subdirective 'statuss' (did you mean 'status'?)"},
		{"max wait", "permits 1\nmaxwait 1s", "(did you mean 'max_wait'?)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "Testfile:", "the error names the line")
		})
	}
	_, err := parse("fair_queue {\npermits 1\nbogus 1\n}")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "did you mean", "no suggestion when no option is near")
}

// A bad JSON value is refused naming its field, never a panic and never
// put silently in place of the default: `reject: [null]` panicked in
// Provision (a nil *RejectConfig), and a negative poll_interval or lease,
// which the Caddyfile refuses ("at least 50ms", "at least 1s"), loaded
// and ran with the default.
func TestJSONConfigRefusesANullRejectAndNegativeDurations(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"null reject", `"permits":1,"reject":[null]`, `reject`},
		{"negative poll_interval", `"permits":1,"poll_interval":"-1s"`, `poll_interval`},
		{"negative lease", `"permits":1,"lease":"-1s"`, `lease`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = loadHandlerJSON(t, tc.fields) })
			require.Error(t, err, "the config loads")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A duration field takes a string such as "20s" (or an integer of
// nanoseconds, as every Caddy duration): one given another kind of value
// was told "want an integer", which sent operators to write 20 for 20s
// (20 ns, refused next as below 50ms).
func TestJSONConfigDurationOfAnotherKindIsToldADuration(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct{ fields, want string }{
		{`"permits":1,"max_wait":true`, `max_wait: want a duration such as "20s", got a bool`},
		{`"permits":1,"max_wait":1.5`, `max_wait: want a duration such as "20s", got a number 1.5`},
		{`"permits":1,"redis":{"read_timeout":{}}`, `redis.read_timeout: want a duration such as "20s", got an object`},
		{`"permits":1,"adaptive":{"target_ttft":[1]}`, `adaptive.target_ttft: want a duration such as "20s", got an array`},
	} {
		err := loadHandlerJSON(t, tc.fields)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}
