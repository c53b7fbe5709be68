package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// status --redis is what a monitoring script runs: when Redis cannot be
// read it fails (a non-zero exit), whether it lists the queues itself or
// is given them with --queue, and still prints what it could not read.
func TestStatusFromRedisFailsWhenRedisCannotBeRead(t *testing.T) {
	dead := "redis://" + deadAddr(t)
	_, err := runCLI(t, "status", "--redis", dead)
	require.Error(t, err, "listing the queues of an unreachable Redis")

	out, err := runCLI(t, "status", "--redis", dead, "--queue", "chat", "--queue", "embed")
	require.Error(t, err, "an unreachable Redis, the queues named")
	assert.Contains(t, err.Error(), "2 of 2 queues")
	assert.Contains(t, out, "chat: inspect {fair_queue:chat}: dial tcp", "the table still says why")
}

// One queue that cannot be read (here: on a Redis Cluster, another node
// serves it) fails the command too; the queues read are printed.
func TestStatusFromRedisFailsWhenOneQueueCannotBeRead(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	failed := 0
	for _, addr := range c.Addrs() {
		out, err := runCLI(t, "status", "--redis", "redis://"+addr, "--queue", "chat")
		if err == nil { // the node that serves the queue
			assert.Regexp(t, `(?m)^chat\s+redis `, out)
			continue
		}
		failed++
		assert.ErrorContains(t, err, "1 of 1 queues", "on %s", addr)
		assert.Contains(t, out, "MOVED", "on %s", addr)
	}
	assert.Equal(t, 2, failed, "the two nodes that do not serve the queue")
}
