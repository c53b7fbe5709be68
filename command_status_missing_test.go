package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A queue named with --queue that Redis holds nothing of (a mistyped
// name, or the config's key_prefix left out) is not an idle queue: a
// monitoring script reading it would see 0 waiting and 0 in flight for
// ever. status --redis fails naming it, as purge does, and prints the
// queues it did find.
func TestStatusFromRedisFailsOnAQueueWithNoKeys(t *testing.T) {
	rds := redistest.Start(t)
	seedQueue(t, rds, "chat")
	url := "redis://" + rds.Addr() + "/0"

	out, err := runCLI(t, "status", "--redis", url, "--queue", "chat", "--queue", "chta")
	require.Error(t, err, "a queue that is not there: %s", out)
	assert.ErrorContains(t, err, "1 of 2 queues")
	assert.Regexp(t, `(?m)^chat\s+redis \S+\s+-\s+1\s+1\s+1\s+1$`, out, "the queue found is printed")
	assert.Regexp(t, `(?m)^chta\s+redis \S+\s+-\s+\?\s+\?\s+\?\s+\?$`, out, "no counts for a queue that is not there")
	assert.Contains(t, out, "chta: no keys under --key-prefix fair_queue")

	out, err = runCLI(t, "status", "--redis", url, "--queue", "chat", "--key-prefix", "other")
	require.Error(t, err, "the queue's prefix left out: %s", out)
	assert.Contains(t, out, "chat: no keys under --key-prefix other")

	_, err = runCLI(t, "status", "--redis", url, "--queue", "chat")
	require.NoError(t, err, "a queue with keys")
}

// Through the admin endpoint, a --queue the running Caddy does not serve
// fails naming it, instead of "no queues" (Caddy serves queues, only
// not that one).
func TestStatusFailsOnAQueueTheAdminEndpointDoesNotServe(t *testing.T) {
	admin := fakeAdmin(t, adminJSON)
	out, err := runCLI(t, "status", "--admin", admin, "--queue", "chta")
	require.Error(t, err, "printed %q", out)
	assert.ErrorContains(t, err, `"chta"`)
	assert.ErrorContains(t, err, "not served")
	assert.NotContains(t, out, "no queues")

	out, err = runCLI(t, "status", "--admin", admin, "--queue", "embed", "--queue", "chta")
	require.Error(t, err)
	assert.ErrorContains(t, err, `"chta"`)
	assert.Regexp(t, `(?m)^embed\s+local\s+2\s+0\s+0\s+0\s+0$`, out, "the queue served is printed")

	_, err = runCLI(t, "status", "--admin", admin, "--queue", "embed")
	require.NoError(t, err)
}
