package caddyfairqueue

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A user of the tools whose URL names a database other than 0
// (redis://.../1) is refused SELECT, which its client runs on each
// connection, and SCAN, to list the queues: status --redis and purge
// --dead without --queue give the ACL it needs. Granted exactly that,
// the user lists the queues of database 1 and sweeps them. The ACL given
// was the tools' of database 0 (ACLRules with SCAN, no SELECT): a user
// granted it was refused SELECT again, and told to grant the same ACL.
func TestAToolsUserGrantedTheACLGivenForADatabaseListsItsQueues(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	h := provision(t, newContext(t), "", &Handler{Name: "db1", Permits: 1, OnStoreError: FailClosed,
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, DB: 1}})
	handsOverThePermit(t, h)
	grant := func(rules string) {
		t.Helper()
		args := []any{"ACL", "SETUSER", "fqcli", "on", ">fq-secret"}
		for _, r := range strings.Fields(rules) {
			args = append(args, r)
		}
		require.NoError(t, admin.Do(ctx, args...).Err())
	}
	needs := regexp.MustCompile(`needs: ACL SETUSER <user> (.+)$`)
	url := "redis://fqcli:fq-secret@" + srv.Addr() + "/1"
	for _, cmd := range [][]string{
		{"status", "--redis", url},
		{"purge", "--redis", url, "--dead", "--dead-for", "1h", "--yes"},
	} {
		grant("resetkeys resetchannels -@all") // granted nothing
		out, err := runCLI(t, cmd...)
		require.Error(t, err, out)
		m := needs.FindStringSubmatch(err.Error())
		require.NotNil(t, m, "%v: the ACL it needs: %v", cmd, err)
		grant(m[1])
		out, err = runCLI(t, cmd...)
		require.NoError(t, err, "%v, granted %s: %s", cmd, m[1], out)
		if cmd[0] == "status" {
			assert.Regexp(t, `(?m)^db1\s+redis `, out)
		}
	}
	require.NoError(t, h.Cleanup())
}
