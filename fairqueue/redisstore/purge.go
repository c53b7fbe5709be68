package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Purge implements fairqueue.Inspector: it deletes every key of the
// queue. Nodes still running re-create what they need on their next call.
func (s *Store) Purge(ctx context.Context) error {
	del := func() *redis.IntCmd { return s.rdb.Del(ctx, s.keys...) }
	cmd := del
	if s.bound { // bounded by ctx (see bounded)
		cmd = func() *redis.IntCmd {
			return within(ctx, del, func(ctx context.Context) *redis.IntCmd {
				c := redis.NewIntCmd(ctx)
				c.SetErr(ctx.Err())
				return c
			})
		}
	}
	if err := cmd().Err(); err != nil {
		return fmt.Errorf("purge %s: %w", s.tag, err)
	}
	return nil
}

// purgeDead deletes KEYS when no node's liveness entry (KEYS[ARGV[1]],
// scored by its expiry in ms of Redis' clock) is later than ARGV[2] ms
// ago; it returns the number of keys deleted, or -1 when a node is live.
var purgeDead = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZCOUNT', KEYS[tonumber(ARGV[1])], now - tonumber(ARGV[2]), '+inf') > 0 then
  return -1
end
return redis.call('DEL', unpack(KEYS))
`)

// PurgeDead deletes every key of the queue, as Purge does, if no node
// has been live in it for the last dead: its instances crashed (no
// leave) and none opened it since, which no heartbeat or leave of the
// queue would ever clean up, as for a queue named from the request whose
// name nobody sends again. The check and the delete are one script: a
// node that joins meanwhile keeps its queue. It reports whether the
// queue was dead (false with nothing deleted when a node is live).
func (s *Store) PurgeDead(ctx context.Context, dead time.Duration) (bool, error) {
	nodes := slices.Index(keyNames, "nodes") + 1
	n, err := purgeDead.Run(ctx, s.sc, s.keys, nodes, strconv.FormatInt(dead.Milliseconds(), 10)).Int64()
	if err != nil {
		return false, fmt.Errorf("purge %s: %w", s.tag, err)
	}
	return n >= 0, nil
}
