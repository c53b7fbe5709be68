package caddyfairqueue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The ACL the log, status --redis and the admin API give a refused user
// (redisstore.ACLRules) is one that works for the queue's key_prefix,
// whatever characters it holds: a user granted exactly it queues through
// Redis, status --redis reads the queue (and lists it, as a user granted
// the tools' redisstore.ListRules), and the queue leaves nothing when
// unloaded. A prefix with characters special in ACL patterns (`[`,
// `\`, `*`, `?`) is granted as written, not as a pattern: `team[1]`
// would grant `{team1:` only, and `a*b` every prefix from `a` to `b`.
func TestTheACLGivenForAKeyPrefixGrantsItsQueuesAndNoOthers(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := context.Background()
	for _, tc := range []struct{ prefix, other string }{
		{"", "fair_queuex"},
		{"team[1]", "team1"},
		{`a\b`, "ab"},
		{"a*b", "aXb"},
		{"x?y", "xZy"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			srv := redistest.Start(t)
			args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
			for _, r := range strings.Fields(redisstore.ACLRules(tc.prefix)) {
				args = append(args, r)
			}
			admin := srv.Client(t)
			require.NoError(t, admin.Do(ctx, args...).Err())
			for _, dry := range [][]any{
				{"SET", "{" + tc.other + ":q}:x", "1"},
				{"SET", "{" + tc.other + "}:queues", "1"},
				{"SPUBLISH", "{" + tc.other + ":q}:node:1", "x"},
			} {
				res, err := admin.Do(ctx, append([]any{"ACL", "DRYRUN", "fq"}, dry...)...).Text()
				require.NoError(t, err)
				assert.NotEqual(t, "OK", res, "%s %q: granted the keys and channels of another key_prefix", redisstore.ACLRules(tc.prefix), dry)
			}

			h := provision(t, newContext(t), "", &Handler{Name: "q", Permits: 1, OnStoreError: FailClosed,
				Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret", KeyPrefix: tc.prefix}})
			handsOverThePermit(t, h)
			out, err := runCLI(t, "status", "--redis", "redis://fq:fq-secret@"+srv.Addr(), "--key-prefix", tc.prefix, "--queue", "q")
			require.NoError(t, err, out)
			assert.Regexp(t, `(?m)^q\s+redis `, out)
			// Listing the queues takes SCAN too, the tools' (ListRules).
			list := []any{"ACL", "SETUSER", "fqcli", "on", ">fq-secret"}
			for _, r := range strings.Fields(redisstore.ListRules(tc.prefix, 0)) {
				list = append(list, r)
			}
			require.NoError(t, admin.Do(ctx, list...).Err())
			out, err = runCLI(t, "status", "--redis", "redis://fqcli:fq-secret@"+srv.Addr(), "--key-prefix", tc.prefix)
			require.NoError(t, err, out)
			assert.Regexp(t, `(?m)^q\s+redis `, out)
			require.NoError(t, h.Cleanup())
			require.Eventually(t, func() bool { return len(srv.Keys(t, "*")) == 0 }, 10*time.Second, 20*time.Millisecond,
				"keys left after the config was unloaded: %v", srv.Keys(t, "*"))
		})
	}
}

// The ACL given leaves the server's other users alone: the queue runs its
// scripts with EVALSHA and EVAL, and manages no script or function, so a
// user granted it cannot flush the functions of every application on the
// server (FUNCTION FLUSH, which -@dangerous lets through), delete one,
// flush the script cache or kill another's script.
func TestTheACLGivenCannotFlushOrKillTheServersScriptsAndFunctions(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
	for _, r := range strings.Fields(redisstore.ACLRules("")) {
		args = append(args, r)
	}
	admin := srv.Client(t)
	require.NoError(t, admin.Do(ctx, args...).Err())
	for _, cmd := range [][]any{
		{"FUNCTION", "FLUSH"}, {"FUNCTION", "DELETE", "lib"}, {"FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() end)"},
		{"SCRIPT", "FLUSH"}, {"SCRIPT", "KILL"},
	} {
		res, err := admin.Do(ctx, append([]any{"ACL", "DRYRUN", "fq"}, cmd...)...).Text()
		require.NoError(t, err)
		assert.NotEqual(t, "OK", res, "%s lets the user run %q", redisstore.ACLRules(""), cmd)
	}
}
