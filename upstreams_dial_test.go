package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validatePool validates, as caddy validate does, a Caddy config whose
// route has a fair_queue with one upstream, dial, and a reverse_proxy to
// the granted upstream.
func validatePool(t *testing.T, dial string) error {
	t.Helper()
	var cfg caddy.Config
	require.NoError(t, json.Unmarshal(fmt.Appendf(nil, `{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"pool-dial","upstreams":[{"dial":%q,"permits":1}]},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`, dial), &cfg))
	return caddy.Validate(&cfg)
}

// An upstream's address is what reverse_proxy dials: a URL, a host
// without a port or a port that is not a number loaded, and then every
// request of the queue answered 502 (reverse_proxy cannot dial it).
// Caddy refuses such a config at load (and caddy validate says why).
func TestUpstreamThatCannotBeDialedIsRefusedAtLoad(t *testing.T) {
	for _, dial := range []string{"http://10.0.0.5:8000", "10.0.0.5", "localhost:http", "10.0.0.5:8000-8001"} {
		err := validatePool(t, dial)
		if assert.Error(t, err, "%s loads, and no request to it is ever served", dial) {
			assert.Contains(t, err.Error(), `upstreams[0].dial: "`+dial+`": `, "the JSON field and its value")
		}
	}
	for _, dial := range []string{"10.0.0.5:8000", "[::1]:8000", "vllm:8000", "unix//run/vllm.sock", "{env.VLLM_HOST}:8000"} {
		require.NoError(t, validatePool(t, dial), dial)
	}
	_, err := parse("fair_queue {\nupstream http://10.0.0.5:8000 4\n}")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Testfile:", "the Caddyfile error carries the line")
}
