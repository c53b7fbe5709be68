package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// purge --queue with a name or a --key-prefix that matches no queue in
// Redis (a typo, the config's key_prefix forgotten) deletes nothing: it
// says so and fails, rather than report the queue purged while the
// broken one is left as it was.
func TestPurgeOfAQueueWithNoKeysSaysNothingWasPurged(t *testing.T) {
	rds := redistest.Start(t)
	st := seedQueue(t, rds, "chat")
	kept := rds.Keys(t, "*")

	for _, args := range [][]string{
		{"--queue", "chta"},                        // a typo
		{"--queue", "chat", "--key-prefix", "llm"}, // another prefix than the queue's
	} {
		out, err := runCLI(t, append([]string{"purge", "--redis", "redis://" + rds.Addr(), "--yes"}, args...)...)
		require.Error(t, err, "%v", args)
		assert.ErrorContains(t, err, "nothing purged", "%v", args)
		assert.ErrorContains(t, err, "--key-prefix", "%v", args)
		assert.NotContains(t, out, "purged queue", "%v", args)
	}
	assert.Equal(t, kept, rds.Keys(t, "*"), "nothing was deleted")

	out, err := runCLI(t, "purge", "--queue", "chat", "--redis", "redis://"+rds.Addr(), "--yes")
	require.NoError(t, err)
	assert.Contains(t, out, "purged queue \"chat\"")
	assert.Empty(t, rds.Keys(t, st.Tag()+"*"))
}

// purge --dead --queue NAME, NAME matching no queue, says so too, rather
// than report a dead queue purged.
func TestPurgeDeadOfAQueueWithNoKeysSaysNothingWasPurged(t *testing.T) {
	rds := redistest.Start(t)
	seedQueue(t, rds, "chat")
	kept := rds.Keys(t, "*")

	out, err := runCLI(t, "purge", "--dead", "--queue", "chta", "--redis", "redis://"+rds.Addr(), "--yes")
	require.Error(t, err, "printed: %s", out)
	assert.ErrorContains(t, err, "nothing purged")
	assert.NotContains(t, out, "purged dead queue")
	assert.Equal(t, kept, rds.Keys(t, "*"))
}
