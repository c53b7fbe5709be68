package caddyfairqueue

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A queue that no request has used yet keeps the settings it was opened
// with until a handler applies its own: a reload (an admin API PATCH)
// that changes them must show them at once, in the admin API, the CLI
// and the metrics, as for a queue that has served.

// permitsOf is the permits in force of the open queue name.
func permitsOf(t *testing.T, name string) int {
	t.Helper()
	for _, e := range openEngines() {
		if e.name == name {
			return e.q.Config().Permits
		}
	}
	t.Fatalf("queue %q not open", name)
	return 0
}

func TestAReloadShowsTheNewPermitsOfAQueueNoRequestHasUsed(t *testing.T) {
	a := newPeakUpstream(t)
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 1, a)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	require.Equal(t, 1, permitsOf(t, "older"))

	require.NoError(t, caddy.Load([]byte(olderConfig(port, 3, a)), false))
	assert.Eventually(t, func() bool { return permitsOf(t, "older") == 3 }, 5*time.Second, 10*time.Millisecond,
		"permits raised on the same route")

	require.NoError(t, caddy.Load([]byte(olderConfig(port, 2, a)), false))
	assert.Eventually(t, func() bool { return permitsOf(t, "older") == 2 }, 5*time.Second, 10*time.Millisecond,
		"permits lowered")
}
