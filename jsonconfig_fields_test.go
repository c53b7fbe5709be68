package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A JSON config (caddy run --config, the admin API's POST /load) is
// refused with the field at fault named as the JSON names it: its path,
// with the index of a list's entry and the key of an object's, not the
// Caddyfile's option (`weight` for `weights`, `reject` without the
// entry, `address` for `addresses`). A tenant's value, a secret, is
// named by its key, never echoed.
func TestJSONConfigErrorsNameTheJSONFieldAtFault(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	t.Setenv("FQ_TEST_UNSET_TENANT", "")
	const secret = "sk-live-4f9a2c"
	const pool = `"upstreams":[{"dial":"127.0.0.1:8000","permits":2}],`
	for _, tc := range []struct{ name, fields, want string }{
		{"weight by key out of bounds", `"permits":1,"tenant":"t","weights":{"sha256:0123456789abcdef":5000}`,
			`weights["sha256:0123456789abcdef"]: must be 0.01 to 1000, got 5000`},
		{"weight by value out of bounds", `"permits":1,"tenant":"t","weights":{"` + secret + `":5000}`,
			`weights[<the value of key sha256:` + fairqueue.TenantKey(secret) + `>]: must be 0.01 to 1000, got 5000`},
		{"malformed key", `"permits":1,"tenant":"t","weights":{"sha256:0123":2}`,
			`weights["sha256:0123"]: a sha256: tenant key must be 16 lowercase hex digits`},
		{"weights without tenant", `"permits":1,"weights":{"` + secret + `":2}`, `weights: requires tenant`},
		{"weight empty once replaced", `"permits":1,"tenant":"t","weights":{"{env.FQ_TEST_UNSET_TENANT}":2}`,
			`weights["{env.FQ_TEST_UNSET_TENANT}"]: the tenant is empty once its placeholders are replaced`},
		{"reject status", `"permits":1,"reject":[{"status":429},{"status":100}]`, `reject[1].status: must be 200-599, got 100`},
		{"reject sse_status", `"permits":1,"reject":[{"status":429},{"sse_status":100}]`, `reject[1].sse_status: must be 200-599, got 100`},
		{"reject reason", `"permits":1,"reject":[{"reasons":["timeout","bogus"],"status":500}]`, `reject[0].reasons[1]: unknown reason "bogus"`},
		{"reject retry_after", `"permits":1,"reject":[{"retry_after":"x"}]`, `reject[0].retry_after: must be a positive duration or auto, got "x"`},
		{"reject sse_event", `"permits":1,"reject":[{"sse_event":"a\nb"}]`, `reject[0].sse_event: must be one line`},
		{"reject set twice", `"permits":1,"reject":[{"status":429},{"body":"x"},{"status":430}]`,
			`reject[2].status: is set twice for every reason (reject[0] sets it too)`},
		{"reject set twice for a reason", `"permits":1,"reject":[{"reasons":["timeout"],"status":429},{"reasons":["queue_full","timeout"],"status":430}]`,
			`reject[1].status: is set twice for reason timeout (reject[0] sets it too)`},
		{"upstream a URL", `"upstreams":[{"dial":"http://127.0.0.1:8000","permits":1}]`, `upstreams[0].dial: "http://127.0.0.1:8000": the address is dialed, not a URL: give host:port`},
		{"upstream without permits", `"upstreams":[{"dial":"127.0.0.1:8000","permits":1},{"dial":"127.0.0.1:8001"}]`, `upstreams[1].permits: must be at least 1, got 0`},
		{"upstream listed twice", `"upstreams":[{"dial":"127.0.0.1:8000","permits":1},{"dial":"127.0.0.1:8000","permits":1}]`, `upstreams[1].dial: 127.0.0.1:8000 is listed twice`},
		{"upstream kv_tokens on some", `"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":10},{"dial":"b:1","permits":1}]`,
			`upstreams[1].kv_tokens: is set on 1 of the 2 upstreams, not on this one (b:1)`},
		{"requeue_on status", pool + `"requeue_on":[429,200]`, `requeue_on[1]: must be 400 to 599, got 200`},
		{"requeue_on without a pool", `"permits":1,"requeue_on":[429]`, `requeue_on: requires upstreams`},
		{"names listed twice", `"permits":1,"name":"{http.fair_queue.model}","names":["a","b","a"]`, `names[2]: "a" is listed twice`},
		{"redis mode", `"permits":1,"redis":{"mode":"ring"}`, `redis.mode: must be standalone, sentinel or cluster, got "ring"`},
		{"redis addresses", `"permits":1,"redis":{"addresses":["a:1","b:2"]}`, `redis.addresses: mode standalone takes one address, got 2`},
		{"redis url and addresses", `"permits":1,"redis":{"url":"redis://a:1","addresses":["b:2"]}`, `redis: url and addresses are mutually exclusive`},
		{"redis url", `"permits":1,"redis":{"url":"bogus://x"}`, `redis.url: invalid url`},
		{"redis timeout", `"permits":1,"redis":{"read_timeout":500}`, `redis.read_timeout: must be at least 1ms, got 500ns`},
		{"redis db", `"permits":1,"redis":{"mode":"cluster","addresses":["a:1"],"db":2}`, `redis.db: must be 0 with mode cluster, got 2`},
		{"reject_stream key", `"permits":1,"redis":{},"reject_stream":{"maxlen":5}`, `reject_stream.key: is required`},
		{"reject_stream field", `"permits":1,"redis":{},"reject_stream":{"key":"k","fields":{"reason":"x"}}`, `reject_stream.fields["reason"]: is built in`},
		{"adaptive floor", `"permits":1,"adaptive":{"floor":2,"target_ttft":"1s"}`, `adaptive.floor: must be in (0, 1], got 2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err, "the config loads")
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), secret, "a tenant's value is never echoed")
		})
	}
}
