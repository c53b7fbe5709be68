package caddyfairqueue

import (
	"sync"
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
// loaded machine. Only a server of the config replaced counts: the
// shutdown of an earlier config's server (an earlier test's, whose
// caddy.Stop returned before it) may come later still. Where the config
// replaced has several servers with a fair_queue handler, the first of
// them to close its listeners ends the wait.
func reload(t *testing.T, config string) {
	t.Helper()
	old := caddy.ActiveContext().Done()
	require.NotNil(t, old, "no config in force to replace")
	closed := make(chan struct{})
	var once sync.Once
	seen := func(h *Handler) {
		if h.load == old {
			once.Do(func() { close(closed) })
		}
	}
	shutDown.Store(&seen)
	defer shutDown.Store(nil)
	require.NoError(t, caddy.Load([]byte(config), false))
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the old config's server never closed its listeners")
	}
}
