package caddyfairqueue

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
)

// reload loads config over the config in force, one server of which has
// a fair_queue handler, and returns once that server has closed its
// listeners. Caddy's reload returns as its old servers start shutting
// down, before they close their listeners: a connection accepted in
// between reaches the old config's handler (cleaned up: its request waits
// in the queue in force without serving it as the new config would), and
// a test whose next request must be the new config's first fails on a
// loaded machine.
func reload(t *testing.T, config string) {
	t.Helper()
	before := shutdownsSeen.Load()
	require.NoError(t, caddy.Load([]byte(config), false))
	require.Eventually(t, func() bool { return shutdownsSeen.Load() > before }, 10*time.Second, time.Millisecond,
		"the old config's server never closed its listeners")
}
