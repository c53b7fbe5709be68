package caddyfairqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// cliRedis makes a client for the command line: a single server, short
// timeouts, one dial per attempt (as Caddy's clients, redis.go), the
// password from REDISCLI_AUTH when the URL has none. go-redis's own log
// lines are dropped: every error the command meets is its answer, and
// go-redis would print each failed dial again on stderr, with its
// source file and line.
func cliRedis(rawURL string) (*redis.Client, error) {
	routeRedisLogs.Do(func() { redis.SetLogger(quietRedisLogger{}) })
	o, err := parseRedisURL(rawURL)
	if err != nil {
		return nil, err
	}
	if o.Password == "" {
		o.Password = os.Getenv("REDISCLI_AUTH")
	}
	for _, d := range []*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout} {
		if *d <= 0 {
			*d = 2 * time.Second
		}
	}
	o.MaxRetries = 1
	o.DialerRetries = 1
	quietHandshake(o)
	return redis.NewClient(o), nil
}

// quietRedisLogger drops go-redis's log lines, for the command line.
// go-redis has one logger per process: in the process of a command
// nothing else dials Redis (where a Caddy server dialled first, its
// redisLogger stays).
type quietRedisLogger struct{}

// Printf implements go-redis's logging interface.
func (quietRedisLogger) Printf(context.Context, string, ...any) {}

// cliClient is cliRedis' client, or, when the server is a node of a
// Redis Cluster (it answers CLUSTER INFO), a client of that cluster
// seeded with it and with the same options: the command reaches every
// queue then, whichever master serves it. desc names the server (its
// KeyPrefix left to the caller). A server that does not answer fails it.
func cliClient(ctx context.Context, rawURL string) (rdb redis.UniversalClient, desc storeDesc, err error) {
	c, err := cliRedis(rawURL)
	if err != nil {
		return nil, storeDesc{}, err
	}
	o := c.Options()
	desc = storeDesc{Store: "redis", Mode: ModeStandalone, Address: o.Addr, DB: o.DB}
	if err := c.ClusterInfo(ctx).Err(); err != nil {
		var reply redis.Error
		if !errors.As(err, &reply) { // no answer: nothing else would get one
			c.Close()
			return nil, storeDesc{}, fmt.Errorf("redis %s: %w", o.Addr, err)
		}
		return c, desc, nil // a single server ("cluster support disabled")
	}
	c.Close()
	if o.DB != 0 {
		return nil, storeDesc{}, fmt.Errorf("redis: db must be 0 on a Redis Cluster, got %d", o.DB)
	}
	desc.Mode = ModeCluster
	return redis.NewClusterClient(cliClusterOptions(o)), desc, nil
}

// cliClusterOptions are the options of the command line's cluster
// client, seeded with the server of o and with its options.
func cliClusterOptions(o *redis.Options) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		Protocol: o.Protocol, DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout,
		WriteTimeout: o.WriteTimeout, MaxRetries: o.MaxRetries, DialerRetries: o.DialerRetries,
		DisableIdentity: o.DisableIdentity, MaintNotificationsConfig: o.MaintNotificationsConfig,
	}
}

// listQueues is redisstore.ListQueues on rdb, on every master of a
// Redis Cluster (SCAN sees one node's keys only).
func listQueues(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]string, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return redisstore.ListQueues(ctx, rdb, prefix)
	}
	var mu sync.Mutex
	var names []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		found, err := redisstore.ListQueues(ctx, c, prefix)
		mu.Lock()
		names = append(names, found...)
		mu.Unlock()
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// listRules is the ACL a user of the tools needs to list the queues of
// prefix through rdb (redisstore.ListRules), in rdb's database: a URL's
// other than 0 takes SELECT too.
func listRules(rdb redis.UniversalClient, prefix string) string {
	db := 0
	if c, ok := rdb.(*redis.Client); ok {
		db = c.Options().DB
	}
	return redisstore.ListRules(prefix, db)
}

// hasKeys fails when st's queue has no key in Redis: a name given with
// --queue that no instance has open under prefix (mistyped, or not the
// config's key_prefix), which Inspect would show as an idle queue.
func hasKeys(ctx context.Context, rdb redis.UniversalClient, st *redisstore.Store, prefix string) error {
	n, err := rdb.Exists(ctx, st.Keys()...).Result()
	if err != nil {
		return fmt.Errorf("inspect %s: %w", st.Tag(), explainRefusal(err, st.PermissionsNeeded()))
	}
	if n == 0 {
		return fmt.Errorf("no keys under --key-prefix %s (keys %s*): no instance has this queue open there; "+
			"status --redis without --queue lists the queues under a prefix", cmp.Or(prefix, redisstore.DefaultKeyPrefix), st.Tag())
	}
	return nil
}

// explainRefusal words Redis's NOPERM (fairqueue.Refused) as what it
// is: the user lacks a permission (an ACL grant), Redis is up; with the
// ACL a user of the queues needs (redisstore.Store.PermissionsNeeded).
func explainRefusal(err error, needs string) error {
	if !fairqueue.Refused(err) {
		return err
	}
	return fmt.Errorf("Redis refused this user a permission (%w); a user of the queues needs: ACL SETUSER <user> %s", err, needs)
}
