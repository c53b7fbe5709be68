package caddyfairqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

func runPurge(cmd *cobra.Command, _ []string) error {
	fl := cmd.Flags()
	name, _ := fl.GetString("queue")
	rawURL, _ := fl.GetString("redis")
	prefix, _ := fl.GetString("key-prefix")
	yes, _ := fl.GetBool("yes")
	dead, _ := fl.GetBool("dead")
	deadFor, _ := fl.GetDuration("dead-for")
	switch {
	case name == "" && !dead:
		return errors.New("--queue is required (or --dead)")
	case rawURL == "":
		return errors.New("--redis is required")
	case !dead && fl.Changed("dead-for"):
		return errors.New("--dead-for needs --dead: without it purge deletes the queue whether or not an instance is alive in it")
	case dead && deadFor <= 0:
		return fmt.Errorf("--dead-for must be positive, got %s", deadFor)
	case !yes && dead:
		return errors.New("refusing to purge dead queues without --yes: it deletes the whole state in Redis " +
			"of every queue no instance has kept alive for " + deadFor.String())
	case !yes:
		return fmt.Errorf("refusing to purge queue %q without --yes: it deletes the queue's whole state in Redis "+
			"(live instances put back their own permits and waiters at their next heartbeat; everything else is lost)", name)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), cliTimeout)
	defer cancel()
	rdb, _, err := cliClient(ctx, rawURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if dead {
		return purgeDeadQueues(ctx, cmd, rdb, prefix, name, deadFor)
	}
	st := redisstore.New(rdb, name, redisstore.Options{KeyPrefix: prefix})
	if err := mustExist(ctx, rdb, st, name, prefix); err != nil {
		return err
	}
	before, err := st.Inspect(ctx, 0, 0)
	if err != nil {
		return err
	}
	reg, err := registered(ctx, rdb, prefix)
	if err != nil {
		return err
	}
	since := time.Now()
	if err := st.Purge(ctx); err != nil {
		return err
	}
	if err := reg.unregister(ctx, rdb, prefix, st.Tag(), since); err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "purged queue %q (keys %s*): %d waiting, %d holders; "+
		"live instances put back their own at their next heartbeat\n", name, termText(st.Tag()), before.Waiting, len(before.Holders))
	return err
}

// mustExist fails, saying nothing was purged, when the queue name has no
// key under prefix: a mistyped name, or not the prefix of the queue's
// config, which a purge would otherwise report purged.
func mustExist(ctx context.Context, rdb redis.UniversalClient, st *redisstore.Store, name, prefix string) error {
	n, err := rdb.Exists(ctx, st.Keys()...).Result()
	if err != nil {
		return fmt.Errorf("purge %s: %w", st.Tag(), err)
	}
	if n == 0 {
		return fmt.Errorf("queue %q has no keys under --key-prefix %s (keys %s*): nothing purged; "+
			"status --redis --key-prefix P lists the queues under P", name,
			termCell(cmp.Or(prefix, redisstore.DefaultKeyPrefix)), termText(st.Tag()))
	}
	return nil
}

// purgeDeadQueues purges each queue under prefix (only name, when set)
// that no instance has kept alive for deadFor, and prints one line per
// queue purged.
func purgeDeadQueues(ctx context.Context, cmd *cobra.Command, rdb redis.UniversalClient, prefix, name string, deadFor time.Duration) error {
	names := []string{name}
	if name != "" {
		if err := mustExist(ctx, rdb, redisstore.New(rdb, name, redisstore.Options{KeyPrefix: prefix}), name, prefix); err != nil {
			return err
		}
	} else {
		var err error
		if names, err = listQueues(ctx, rdb, prefix); err != nil {
			return explainRefusal(err, listRules(rdb, prefix))
		}
	}
	reg, err := registered(ctx, rdb, prefix)
	if err != nil {
		return err
	}
	purged := 0
	for _, n := range names {
		st := redisstore.New(rdb, n, redisstore.Options{KeyPrefix: prefix})
		since := time.Now()
		was, err := st.PurgeDead(ctx, deadFor)
		if err != nil {
			return err
		}
		if was {
			purged++
			if err := reg.unregister(ctx, rdb, prefix, st.Tag(), since); err != nil {
				return err
			}
			if _, err := fmt.Fprintf(cmd.OutOrStdout(), "purged dead queue %s (keys %s*)\n", termText(n), termText(st.Tag())); err != nil {
				return err
			}
		}
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%d of %d queues dead for %s purged\n", purged, len(names), deadFor)
	return err
}

// registry maps the tag of each queue the registry names to its names
// there: the registry names a queue as its instances do (a brace kept),
// ListQueues as its keys' tag does.
type registry map[string][]string

// registered reads the registry under prefix. A node of a Redis Cluster
// that answers MOVED (a client of one node where cliClient could not
// tell a cluster) leaves it alone (an empty map).
func registered(ctx context.Context, rdb redis.UniversalClient, prefix string) (registry, error) {
	key := redisstore.RegistryKey(prefix)
	names, err := rdb.ZRange(ctx, key, 0, -1).Result()
	if err != nil && !redis.HasErrorPrefix(err, "MOVED") {
		return nil, fmt.Errorf("reading the registry of queues %s: %w", key, err)
	}
	reg := registry{}
	for _, n := range names {
		tag := redisstore.TagOf(prefix, n)
		reg[tag] = append(reg[tag], n)
	}
	return reg, nil
}

// unregister takes the names of the queue whose keys start with tag out
// of the registry, unless an instance named it after since (it opened
// the queue again).
func (reg registry) unregister(ctx context.Context, rdb redis.UniversalClient, prefix, tag string, since time.Time) error {
	for _, n := range reg[tag] {
		if err := redisstore.Unregister(ctx, rdb, prefix, n, since); err != nil {
			return err
		}
	}
	return nil
}
