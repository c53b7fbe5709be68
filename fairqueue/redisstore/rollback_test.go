package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// snapshotScript dumps every key of the database with its time to live
// (ms; -1 for none), in one step: the state an asynchronous replica
// holds when its link to the master is cut.
var snapshotScript = redis.NewScript(`
local out = {}
for _, k in ipairs(redis.call('KEYS', '*')) do
  out[#out+1] = k
  out[#out+1] = redis.call('PTTL', k)
  out[#out+1] = redis.call('DUMP', k)
end
return out`)

// rollbackScript replaces every key of the database with ARGV (key, ttl,
// dump, ...), in one step: the replica promoted in a failover, or a
// restart from an older RDB or AOF.
var rollbackScript = redis.NewScript(`
for _, k in ipairs(redis.call('KEYS', '*')) do
  redis.call('DEL', k)
end
for i = 1, #ARGV, 3 do
  local ttl = tonumber(ARGV[i+1])
  if ttl < 0 then ttl = 0 end
  redis.call('RESTORE', ARGV[i], ttl, ARGV[i+2], 'REPLACE')
end
return #ARGV / 3`)

// snapshot records rdb's data set, as a replica cut from its master
// would hold it; the function it returns puts that data set back (the
// writes since are lost, as in a failover to that replica: the data
// set's epoch is the same), runs check on it, and drops every Pub/Sub
// connection, as the failover would, so that every node subscribes
// again (and only then learns of the failover).
func snapshot(t *testing.T, rdb *redis.Client) (rollback func(check func())) {
	t.Helper()
	ctx := context.Background()
	dump, err := snapshotScript.Run(ctx, rdb, nil).Slice()
	require.NoError(t, err)
	taken := time.Now()
	return func(check func()) {
		t.Helper()
		args := make([]any, 0, len(dump))
		for i := 0; i < len(dump); i += 3 {
			ttl := dump[i+1].(int64)
			if ttl > 0 {
				// Time ran on while the replica was promoted.
				ttl = max(ttl-time.Since(taken).Milliseconds(), 1)
			}
			args = append(args, dump[i], ttl, dump[i+2])
		}
		require.NoError(t, rollbackScript.Run(ctx, rdb, nil, args...).Err())
		check()
		require.NoError(t, rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
	}
}
