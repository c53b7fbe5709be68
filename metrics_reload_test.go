package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRejectedConfigLoadKeepsTheQueueMetrics runs Caddy in this process:
// a good config, then a POST /load that fails to provision. Caddy
// replaces its admin endpoint, and with it the registry /metrics serves,
// before it provisions the new config's apps, so a load that then fails
// leaves /metrics serving the failed config's registry: Caddy's own HTTP
// series are gone until a good config loads. The queue's series must not
// be: the queue of the config in force still runs.
func TestRejectedConfigLoadKeepsTheQueueMetrics(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	config := func(permits int) string {
		return fmt.Sprintf(`{"admin":{"listen":%q},"logging":{"logs":{"default":{"level":"ERROR"}}},
			"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
			{"handler":"fair_queue","name":"reload-metrics","permits":%d},
			{"handler":"static_response","status_code":200}]}]}}}}}`, admin, freePort(t), permits)
	}
	require.NoError(t, caddy.Load([]byte(config(2)), false))
	t.Cleanup(func() {
		_ = caddy.Load([]byte(`{"admin":{"disabled":true}}`), false) // closes the admin endpoint
		_ = caddy.Stop()
	})

	// A failed load puts the config in force back, and Caddy restarts its
	// admin endpoint with it: a scrape sent meanwhile may meet the old
	// listener as it closes (EOF, reset). It is sent again.
	scrape := func() string {
		t.Helper()
		var resp *http.Response
		var err error
		for range 50 {
			if resp, err = http.Get("http://" + admin + "/metrics"); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}
	const series = `caddy_fair_queue_permits{queue="reload-metrics"} 2`
	require.Contains(t, scrape(), series)

	resp, err := http.Post("http://"+admin+"/load", "application/json", strings.NewReader(config(0)))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "permits 0 is refused")

	after := scrape()
	assert.True(t, strings.Contains(after, "caddy_config_last_reload_successful 0"), "Caddy says the load failed")
	assert.True(t, strings.Contains(after, series), "the queue's series stay: its config is still in force")
}
