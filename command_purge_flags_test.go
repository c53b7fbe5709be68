package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// --dead-for only means something with --dead: given without it, as in
// "purge chat if it has been dead 10 minutes", purge refuses, naming the
// flag, instead of deleting a live queue at once.
func TestPurgeRefusesDeadForWithoutDead(t *testing.T) {
	rds := redistest.Start(t)
	seedQueue(t, rds, "chat") // live: its node's lease lasts a minute
	kept := rds.Keys(t, "*")

	_, err := runCLI(t, "purge", "--queue", "chat", "--dead-for", "10m", "--redis", "redis://"+rds.Addr(), "--yes")
	require.Error(t, err)
	assert.ErrorContains(t, err, "--dead-for")
	assert.ErrorContains(t, err, "--dead")
	assert.Equal(t, kept, rds.Keys(t, "*"), "the live queue is untouched")
}
