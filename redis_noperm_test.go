package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A Redis user whose ACL lacks what the queue needs (its channels, its
// scripts' commands, its keys) is answered NOPERM: Redis is up, and the
// fix is a grant, not the network. The log says so, and gives the ACL
// the queue needs; it does not say the store is unreachable.
// on_store_error still answers the requests (here fail_closed: 503
// store_unavailable), as docs/failures.md says.
func TestARedisUserRefusedAPermissionIsLoggedAsARefusalWithTheACLNeeded(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for name, rules := range map[string][]any{
		"nochannels":  {"resetkeys", "resetchannels", "~{fair_queue:*", "~{fair_queue}:*", "+@all", "-@dangerous"},
		"noscripting": {"resetkeys", "~*", "&*", "+@all", "-@dangerous", "-@scripting"},
		"nokeys":      {"resetkeys", "~other:*", "&*", "+@all", "-@dangerous"},
	} {
		t.Run(name, func(t *testing.T) {
			rds := redistest.Start(t)
			require.NoError(t, rds.Client(t).Do(context.Background(),
				append([]any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}, rules...)...).Err())
			logPath := filepath.Join(t.TempDir(), "caddy.log")
			port := freePort(t)
			config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{
		"default":{"writer":{"output":"file","filename":%q},"encoder":{"format":"json"},"level":"INFO"}}},
	"apps":{"http":{"grace_period":"300ms","servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
	{"handler":"fair_queue","name":%q,"permits":2,"max_wait":"20s","on_store_error":"fail_closed",
	 "redis":{"addresses":[%q],"username":"fq","password":"fq-secret"}},
	{"handler":"static_response","body":"ok"}]}]}}}}}`, logPath, port, name, rds.Addr())
			require.NoError(t, caddy.Load([]byte(config), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			for i := range 2 {
				resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/", port), "application/json", strings.NewReader(`{}`))
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "request %d", i)
				assert.Equal(t, "store_unavailable", resp.Header.Get("Fair-Queue-Reason"), "request %d", i)
			}
			var line map[string]any
			require.Eventually(t, func() bool {
				for _, l := range queueLogLines(t, logPath) {
					if l["level"] == "error" {
						line = l
						return true
					}
				}
				return false
			}, 10*time.Second, 20*time.Millisecond, "the error is logged: %v", queueLogLines(t, logPath))
			msg := fmt.Sprint(line["msg"])
			assert.NotContains(t, msg, "unreachable", "Redis answered: %v", line)
			assert.Contains(t, msg, "refused", "%v", line)
			assert.Contains(t, msg, "permission", "%v", line)
			assert.Contains(t, fmt.Sprint(line["error"]), "NOPERM", "%v", line)
			assert.Contains(t, fmt.Sprint(line["needs"]),
				"resetkeys resetchannels ~{fair_queue:* ~{fair_queue}:* &{fair_queue:* -@all +ping ", "the ACL the queue needs: %v", line)
		})
	}
}

// status --redis with a user refused the keys of a queue says that Redis
// refused the user, not only NOPERM at the end of the line.
func TestStatusFromRedisSaysRedisRefusedTheUser(t *testing.T) {
	rds := redistest.Start(t)
	require.NoError(t, rds.Client(t).Do(context.Background(), "ACL", "SETUSER", "chat-only", "on", ">s",
		"resetkeys", "~{fair_queue:chat}:*", "+@all", "-@dangerous").Err())
	seedQueue(t, rds, "chat")
	seedQueue(t, rds, "embed")

	out, err := runCLI(t, "status", "--redis", "redis://chat-only:s@"+rds.Addr(), "--queue", "chat", "--queue", "embed")
	require.Error(t, err)
	assert.Contains(t, out, "embed: inspect {fair_queue:embed}: Redis refused this user a permission")
	assert.Contains(t, out, "~{fair_queue:*")
}

// The admin API shows a store that refuses the instance's user as
// refused, with the error and the ACL the queue needs, beside store_up
// false: not as an outage. Granted what it lacks, the store is up again,
// and the refusal is gone.
func TestTheAdminAPIShowsTheStoresRefusal(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	require.NoError(t, rds.Client(t).Do(context.Background(), "ACL", "SETUSER", "fq", "on", ">fq-secret",
		"resetkeys", "~*", "&*", "+@all", "-@dangerous", "-@scripting").Err())
	h := provision(t, newContext(t), "", &Handler{Name: "refused", Permits: 1, OnStoreError: FailClosed,
		Redis: &RedisConfig{Addresses: []string{rds.Addr()}, Username: "fq", Password: "fq-secret"}})
	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	engines := h.engineList()
	require.Len(t, engines, 1)
	stats := engines[0].report(context.Background()).Stats
	assert.False(t, stats.StoreUp)
	assert.Contains(t, stats.StoreRefused, "NOPERM", "%+v", stats)
	assert.Contains(t, stats.StoreRefused, "ACL SETUSER <user> resetkeys resetchannels ~{fair_queue:*", "%+v", stats)

	require.NoError(t, rds.Client(t).Do(context.Background(), "ACL", "SETUSER", "fq", "+@scripting").Err())
	require.Eventually(t, func() bool {
		stats = engines[0].report(context.Background()).Stats
		return stats.StoreUp
	}, 30*time.Second, 50*time.Millisecond, "the store is up once the user is granted what it lacked")
	assert.Empty(t, stats.StoreRefused)
}
