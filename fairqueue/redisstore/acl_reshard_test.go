package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A user granted exactly ACLRules keeps reading the registry of queues
// on a Redis Cluster while an operator reshards it (redis-cli --cluster
// reshard, a rebalance after adding a master): once the keys of a
// moving slot are on the new owner, and before the slot is its, the old
// owner answers -ASK, and the cluster client sends ASKING before the
// command on the new owner. A user refused ASKING (not granted since
// -@all) was answered NOPERM: the instances' sweep of dead queues (and
// status --redis, purge) failed as a refusal of permission, with an ACL
// to grant that lacked ASKING too. Here the registry's slot moves while
// the queue is open, and the instances' sweep reads the registry.
func TestAUserGrantedACLRulesReadsTheRegistryWhileTheClusterReshards(t *testing.T) {
	ctx := context.Background()
	cluster := redistest.StartCluster(t, 3)
	args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
	for _, r := range strings.Fields(redisstore.ACLRules("")) {
		args = append(args, r)
	}
	for _, n := range cluster.Nodes() {
		require.NoError(t, n.Client(t).Do(ctx, args...).Err())
	}
	rdb := cluster.ClusterClient(t, clusterOpts, func(o *redis.ClusterOptions) {
		o.Username, o.Password = "fq", "fq-secret"
	})
	const name = "reshard"
	q := openQueue(t, rdb, name, fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second})
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := q.Acquire(actx, fairqueue.Request{}) // opens the queue: it is in the registry
	require.NoError(t, err)
	p.Release()
	registry := redisstore.RegistryKey("")
	eventually(t, 10*time.Second, func() bool {
		n, err := cluster.ClusterClient(t).Exists(ctx, registry).Result()
		return err == nil && n == 1
	}, "the queue is not in the registry")

	m := cluster.MigrateSlotKeys(t, registry) // the client still maps the slot to its old owner
	_, err = redisstore.New(rdb, name, redisstore.Options{}).SweepDead(ctx)
	require.NoError(t, err)
	for _, n := range []*redistest.Server{m.From, m.To} {
		log, err := n.Client(t).Do(ctx, "ACL", "LOG").Result()
		require.NoError(t, err)
		for _, e := range log.([]any) {
			require.NotContains(t, fmt.Sprint(e), "object:asking", "denied on %s", n.Addr())
		}
	}
}
