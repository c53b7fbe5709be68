package memstore

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A tenant value a client can vary (docs/hostile-clients.md names
// {http.request.remote.host}, and an IPv6 prefix holds billions) must
// not make the store hold state per tenant it ever saw. A flow served
// once leaves with its counter at V + cost, kept as an idle counter
// while above V; a new flow starts at V, so with every request from a
// new tenant V never moves: the store keeps at most fairqueue.IdleFlows
// of them, the furthest above V.
func TestNewTenantsServedOnceLeaveBoundedState(t *testing.T) {
	f := newFixture(t, 1, 0)
	heavy := f.granted("heavy.0", 5) // used more than the others: remembered longest
	f.release(heavy, 0)
	tenants := fairqueue.IdleFlows + 500
	for i := range tenants {
		id := f.granted(fmt.Sprintf("%016x.0", i), 1)
		f.release(id, 0)
	}
	_, err := f.s.Reconcile(bg, "n1", f.l)
	require.NoError(t, err)
	assert.Empty(t, f.s.flows)
	assert.LessOrEqual(t, len(f.s.idle), fairqueue.IdleFlows, "idle counters kept after %d tenants served once each (V = %v)", tenants, f.s.vtime)
	assert.Contains(t, f.s.idle, "heavy.0", "the counter furthest above V is kept")
}
