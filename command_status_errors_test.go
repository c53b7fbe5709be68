package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// status --redis is what a monitoring script runs: when Redis cannot be
// reached it fails (a non-zero exit) and says why, whether it lists the
// queues itself or is given them with --queue.
func TestStatusFromRedisFailsWhenRedisCannotBeRead(t *testing.T) {
	dead := "redis://" + deadAddr(t)
	_, err := runCLI(t, "status", "--redis", dead)
	require.Error(t, err, "listing the queues of an unreachable Redis")

	_, err = runCLI(t, "status", "--redis", dead, "--queue", "chat", "--queue", "embed")
	require.Error(t, err, "an unreachable Redis, the queues named")
	assert.ErrorContains(t, err, "dial tcp", "says why")
}

// One queue that cannot be read (here: a Redis user granted the keys of
// another queue only) fails the command too; the queues read are printed.
func TestStatusFromRedisFailsWhenOneQueueCannotBeRead(t *testing.T) {
	rds := redistest.Start(t)
	require.NoError(t, rds.Client(t).Do(context.Background(), "ACL", "SETUSER", "chat-only", "on", ">s",
		"resetkeys", "~{fair_queue:chat}:*", "+@all", "-@dangerous").Err())
	seedQueue(t, rds, "chat")
	seedQueue(t, rds, "embed")

	out, err := runCLI(t, "status", "--redis", "redis://chat-only:s@"+rds.Addr(), "--queue", "chat", "--queue", "embed")
	require.Error(t, err)
	assert.ErrorContains(t, err, "1 of 2 queues")
	assert.Regexp(t, `(?m)^chat\s+redis \S+\s+-\s+1\s+1\s+1\s+1$`, out, "the queue read")
	assert.Contains(t, out, "embed: inspect {fair_queue:embed}: Redis refused this user a permission (NOPERM")
}
