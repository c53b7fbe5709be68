package redisstore

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// ACLRules grants the commands the queue runs, and no other: +@all
// -@dangerous let the queue's user switch databases (SELECT, then the
// queues' key patterns in every database), list the names of every key
// of the server's other applications, which are not bound by the key
// patterns (SCAN, RANDOMKEY; a session's token may be a key's name),
// move or copy its keys to another database (MOVE, COPY ... DB), and
// list every application's channels (PUBSUB CHANNELS). Each command is
// run on the queues' own keys and channels, so that only the command's
// grant can refuse it. (DEBUG is not among them: redis-server refuses
// it to every user before the ACL, unless enable-debug-command is set.)
func TestACLRulesGrantOnlyTheCommandsTheQueueRuns(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
	for _, r := range strings.Fields(ACLRules("")) {
		args = append(args, r)
	}
	require.NoError(t, srv.Client(t).Do(ctx, args...).Err())
	require.NoError(t, srv.Client(t).Set(ctx, "{fair_queue:acl}:k", "v", 0).Err())
	// A client of its own for each command: one that SELECTs another
	// database keeps it.
	fq := func() *redis.Client {
		return srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "fq", "fq-secret" })
	}
	require.NoError(t, fq().Do(ctx, "GET", "{fair_queue:acl}:k").Err(), "the queue's keys")
	for _, cmd := range [][]any{
		{"SELECT", "1"},
		{"SCAN", "0"},
		{"RANDOMKEY"},
		{"KEYS", "*"},
		{"MOVE", "{fair_queue:acl}:k", "1"},
		{"COPY", "{fair_queue:acl}:k", "{fair_queue:acl}:k2", "DB", "1"},
		{"SWAPDB", "0", "1"},
		{"FLUSHDB"},
		{"FLUSHALL"},
		{"MIGRATE", "127.0.0.1", "1", "{fair_queue:acl}:k", "0", "10"},
		{"CONFIG", "GET", "maxmemory"},
		{"PUBSUB", "CHANNELS"},
		{"DBSIZE"},
		{"OBJECT", "ENCODING", "{fair_queue:acl}:k"},
		{"RENAME", "{fair_queue:acl}:k", "{fair_queue:acl}:k3"},
		{"CLIENT", "LIST"},
		{"CLIENT", "KILL", "ID", "999999"},
		{"SCRIPT", "FLUSH"},
		{"FUNCTION", "FLUSH"},
		{"MONITOR"},
		{"WAIT", "0", "1"},
	} {
		err := fq().Do(ctx, cmd...).Err()
		if assert.Error(t, err, "%v is granted", cmd) {
			assert.Contains(t, err.Error(), "NOPERM", "%v", cmd)
		}
	}
	require.Equal(t, "v", srv.Client(t).Get(ctx, "{fair_queue:acl}:k").Val(), "the key stayed")
	require.Equal(t, int64(0), srv.Client(t, func(o *redis.Options) { o.DB = 1 }).DBSize(ctx).Val(), "nothing reached database 1")
}
