package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A user granted exactly the ACL given (redisstore.ACLRules) opens a
// queue, over either protocol, with no command refused: the store reads
// the server's version (sharded Pub/Sub or not) with HELLO, which needs
// no grant, not with INFO, which the ACL does not grant (ACL LOG stays
// empty), and still finds Redis 7's sharded Pub/Sub.
func TestAUserGrantedTheACLOpensAQueueWithNoCommandRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client(t)
	setACLUser(t, admin, redisstore.ACLRules(""))
	for _, protocol := range []int{2, 3} {
		name := fmt.Sprintf("acl-resp%d", protocol)
		q := openQueue(t, aclClient(t, srv, protocol), name, fairqueue.Config{Permits: 1})
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err, name)
		p.Release()
		tag := redisstore.New(nil, name, redisstore.Options{}).Tag()
		chs, err := admin.PubSubShardChannels(ctx, tag+":node:*").Result()
		require.NoError(t, err)
		assert.Equal(t, []string{tag + ":node:" + q.Node()}, chs, "shard channels of %s", name)
	}
	assert.Empty(t, aclLog(t, admin), "ACL LOG")
}

// A server that does not know HELLO (Redis 5; here a Redis 7 with HELLO
// renamed away) still tells its version: the store falls back to INFO,
// and uses sharded Pub/Sub where the server has it.
func TestVersionReadWithInfoWhereHelloIsUnknown(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--rename-command", "HELLO", ""))
	ctx := context.Background()
	admin := srv.Client(t, func(o *redis.Options) { o.Protocol = 2 })
	require.Error(t, admin.Do(ctx, "HELLO").Err(), "the server knows HELLO")
	const name = "nohello"
	q := openQueue(t, admin, name, fairqueue.Config{Permits: 1})
	p, err := q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	tag := redisstore.New(nil, name, redisstore.Options{}).Tag()
	chs, err := admin.PubSubShardChannels(ctx, tag+":node:*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{tag + ":node:" + q.Node()}, chs, "shard channels")
}

// setACLUser sets the user fq (password pw) to rules.
func setACLUser(t *testing.T, admin *redis.Client, rules string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", "fq", "on", ">pw"}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	require.NoError(t, admin.Do(context.Background(), args...).Err())
}

// aclClient is a client of the user fq over protocol, with the
// handshake Caddy's clients use (no CLIENT command: the ACL grants none).
func aclClient(t *testing.T, srv *redistest.Server, protocol int) *redis.Client {
	return srv.Client(t, func(o *redis.Options) {
		o.Username, o.Password, o.Protocol = "fq", "pw", protocol
		o.DisableIdentity = true
		o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	})
}

// aclLog returns the entries of the server's ACL LOG.
func aclLog(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	v, err := admin.Do(context.Background(), "ACL", "LOG").Result()
	require.NoError(t, err)
	var out []string
	for _, e := range v.([]any) {
		out = append(out, fmt.Sprint(e))
	}
	return out
}
