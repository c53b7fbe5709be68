package redisstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// On a Redis Cluster, over either protocol (Caddy's clients speak RESP2
// unless the URL asks for 3), a user granted exactly the ACL given opens
// a queue with no command refused on any node: the version is read with
// HELLO from whichever node the cluster client asks, and the grants go
// through sharded Pub/Sub (Redis 7).
func TestAUserGrantedTheACLOpensAQueueOnAClusterWithNoCommandRefused(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	for _, n := range cluster.Nodes() {
		setACLUser(t, n.Client(t), redisstore.ACLRules(""))
	}
	for _, protocol := range []int{2, 3} {
		name := fmt.Sprintf("acl-cluster-resp%d", protocol)
		rdb := cluster.ClusterClient(t, clusterOpts, func(o *redis.ClusterOptions) {
			o.Username, o.Password, o.Protocol = "fq", "pw", protocol
			o.DisableIdentity = true
			o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		})
		q := openQueue(t, rdb, name, fairqueue.Config{Permits: 1})
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err, name)
		p.Release()
		tag := redisstore.New(nil, name, redisstore.Options{}).Tag()
		var chs []string
		for _, n := range cluster.Nodes() {
			c, err := n.Client(t).PubSubShardChannels(ctx, tag+":node:*").Result()
			require.NoError(t, err)
			chs = append(chs, c...)
		}
		assert.Equal(t, []string{tag + ":node:" + q.Node()}, chs, "shard channels of %s", name)
	}
	for _, n := range cluster.Nodes() {
		assert.Empty(t, aclLog(t, n.Client(t)), "ACL LOG of %s", n.Addr())
	}
}
