package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backend_metrics of a queue without a pool is the backend's URL. One
// that is no http(s) URL, such as "vllm:8000/metrics" (the scheme left
// out) or an {env.*} placeholder (never replaced), loaded, and every
// read failed, logged at debug level only: the queue adapted on its
// TTFTs alone, the gauges the operator asked for never read. It is
// refused at load, naming the option and the Caddyfile line.
func TestAdaptiveBackendMetricsMustBeAnHTTPURL(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, v := range []string{"vllm:8000/metrics", "localhost:8000/metrics", "{env.VLLM_METRICS}", "metrics", "ftp://vllm/metrics", "http:///metrics"} {
		_, err := parse("fair_queue {\npermits 4\nadaptive {\ntarget_ttft 1s\nbackend_metrics " + v + "\n}\n}")
		if assert.Error(t, err, "backend_metrics %s parses", v) {
			assert.Contains(t, err.Error(), `adaptive: backend_metrics "`+v+`": want a path on each pool upstream (/metrics) or the backend's http:// or https:// URL`)
			assert.Contains(t, err.Error(), "Testfile:")
		}
		err = loadHandlerJSON(t, `"permits":4,"adaptive":{"target_ttft":"1s","backend_metrics":"`+v+`"}`)
		if assert.Error(t, err, "backend_metrics %s loads", v) {
			assert.Contains(t, err.Error(), `adaptive.backend_metrics: "`+v+`": want`)
		}
	}
	for _, v := range []string{"http://vllm:8000/metrics", "https://10.0.0.5/metrics"} {
		_, err := parse("fair_queue {\npermits 4\nadaptive {\ntarget_ttft 1s\nbackend_metrics " + v + "\n}\n}")
		require.NoError(t, err, v)
	}
}
