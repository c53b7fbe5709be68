package redisstore

import (
	"cmp"
	"strings"

	"github.com/redis/go-redis/v9"
)

// aclCommands are the commands a user of the queues runs, as ACL
// SETUSER grants them: PING (the subscription's health check), the
// scripts (EVALSHA, EVAL when the script is not loaded, their read-only
// forms for Inspect), the commands the scripts call, the Pub/Sub of the
// grants (SPUBLISH and SSUBSCRIBE on Redis 7), a Redis Cluster's slots
// (the cluster client's map), ASKING (the cluster client's, before a
// command it follows -ASK with, while a reshard moves the slot) and
// CLUSTER INFO (the tools tell a cluster with it), the tools' EXISTS,
// ZRANGE and DEL (status, purge), and XADD (a reject_stream, on its own
// key). HELLO and AUTH, the client's
// handshake, need no grant. Not INFO (@dangerous: the store reads the
// server's version with HELLO in its place), SCRIPT or FUNCTION (they
// would flush every application's scripts), nor SELECT (but with a
// database other than 0: DBRules), SCAN (but for the tools' listing:
// ListRules), KEYS, RANDOMKEY (the names of every application's keys,
// which no key pattern bounds), MOVE, COPY, SWAPDB, the flushes, CONFIG,
// CLIENT, PUBSUB...: the queue never runs them.
var aclCommands = []string{
	"ping", "command", "cluster|slots", "cluster|info", "asking",
	// scripts
	"eval", "evalsha", "eval_ro", "evalsha_ro",
	// Pub/Sub
	"publish", "spublish", "subscribe", "ssubscribe",
	// keys, from the scripts and the tools
	"del", "exists", "get", "set", "incr", "incrby", "decrby", "pexpire", "pttl", "time",
	"hdel", "hexists", "hget", "hgetall", "hincrby", "hkeys", "hlen", "hmget", "hset", "hsetnx", "hvals",
	"zadd", "zcard", "zcount", "zlexcount", "zpopmin", "zrange", "zrangebylex", "zrangebyscore",
	"zrank", "zrem", "zremrangebyscore", "zscore",
	"xadd",
}

// ACLRules is the ACL a Redis user needs to hold the queues of key
// prefix ("": DefaultKeyPrefix), as the rules of ACL SETUSER: the queues'
// keys and the registry's, the queues' channels, and the commands the
// queue runs (aclCommands) and no other, starting from none (-@all: a
// user that had more keeps none of it). A user without one of them is
// answered NOPERM. The prefix stands in the patterns as written: its
// characters special in them (`*`, `?`, `[`, `]`, `\`) are quoted, so
// that the rules grant its queues, and no other prefix's. A client of a
// database other than 0 needs SELECT too (DBRules).
func ACLRules(prefix string) string {
	p := globEscape(braces.Replace(cmp.Or(prefix, DefaultKeyPrefix)))
	return "resetkeys resetchannels ~{" + p + ":* ~{" + p + "}:* &{" + p + ":* -@all +" + strings.Join(aclCommands, " +")
}

// DBRules is ACLRules for a client of database db: SELECT added where db
// is not 0, which the client runs on each connection it opens.
func DBRules(prefix string, db int) string {
	if db == 0 {
		return ACLRules(prefix)
	}
	return ACLRules(prefix) + " +select"
}

// ListRules is DBRules with SCAN, which the tools (status and purge
// without a queue's name) list the queues of database db with: SCAN
// reads the name of every key of the database, which no key pattern
// bounds, so that it is kept to the tools' user.
func ListRules(prefix string, db int) string { return DBRules(prefix, db) + " +scan" }

// PermissionsNeeded is DBRules of the store's key prefix and its
// client's database (fairqueue.PermissionNeeder).
func (s *Store) PermissionsNeeded() string {
	db := 0
	if c, ok := s.rdb.(*redis.Client); ok {
		db = c.Options().DB
	}
	return DBRules(s.prefix, db)
}
