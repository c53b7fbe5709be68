package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// zcard returns the size of the sorted set key.
func zcard(t *testing.T, rds *redistest.Server, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := rds.Client(t).ZCard(ctx, key).Result()
	require.NoError(t, err, "ZCARD %s", key)
	return int(n)
}

// Two applications share one Redis and both name their queue "llm";
// their key prefixes keep the queues apart: each has its own permit and
// its own waiters, and no key of one is touched by the other.
func TestKeyPrefixIsolatesApplicationsSharingOneRedis(t *testing.T) {
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	app := func(prefix string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name llm
		permits 1
		max_wait 30s
		redis {
			url redis://%s/0
			key_prefix %s
		}
	}`, rds.Addr(), prefix))
	}
	a := harness.StartCaddy(t, "app-a", app("app_a"), harness.CaddyOptions{})
	b := harness.StartCaddy(t, "app-b", app("app_b"), harness.CaddyOptions{})
	client := newClient(t)
	ctx := context.Background()

	// A's only permit is held: B still serves at once.
	holder := holdPermit(t, client, a.URL(), nil)
	assert.Equal(t, 1, zcard(t, rds, "{app_a:llm}:holders"))
	start := time.Now()
	requireFullStream(t, send(ctx, client, b.URL(), Chat{Stream: true}), 2, "app B while A's permit is held")
	assert.Less(t, time.Since(start), 5*time.Second, "app B waited for app A's permit")

	// A's next request waits in A's queue only.
	waiter := sendAsync(ctx, client, a.URL(), Chat{Stream: true})
	require.True(t, eventually(10*time.Second, func() bool { return zcard(t, rds, "{app_a:llm}:waiting") == 1 }), "A's request not queued")
	assert.Zero(t, zcard(t, rds, "{app_b:llm}:waiting"), "A's waiter in B's queue")
	requireFullStream(t, send(ctx, client, b.URL(), Chat{Stream: true}), 2, "app B while A has a waiter")

	holder.Release()
	requireFullStream(t, await(t, waiter, 30*time.Second), 2, "A's waiter after A's permit came back")
	assert.Empty(t, rds.Keys(t, "{fair_queue:*"), "keys under the default prefix")
	for _, k := range rds.Keys(t, "*") {
		if k == redisstore.RegistryKey("app_a") || k == redisstore.RegistryKey("app_b") {
			continue
		}
		assert.True(t, strings.HasPrefix(k, "{app_a:llm}:") || strings.HasPrefix(k, "{app_b:llm}:"), "key %q outside both prefixes", k)
	}
	for _, prefix := range []string{"app_a", "app_b"} {
		assert.Equal(t, []string{"llm"}, registryNames(t, rds, prefix), "the registry of %s", prefix)
	}
}

// getBody GETs url and returns the status and body.
func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url)
	require.NoError(t, err, "GET %s", url)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// The Redis password never shows: not in the answers to clients while
// Redis refuses it, not in Caddy's logs, not in the fair_queue admin
// endpoint (which is read-only), and, given as an {env.*} placeholder,
// not in Caddy's config API either.
func TestRedisPasswordNeverAppearsInLogsErrorsOrAdmin(t *testing.T) {
	const (
		right    = "r1ght-Pw-4f9c2e"
		wrongURL = "wr0ng-URL-Pw-7d1a"
		wrongOpt = "wr0ng-Opt-Pw-b83e"
	)
	rds := redistest.Start(t)
	// Set at run time: redistest checks the server with an unauthenticated PING.
	require.NoError(t, rds.Client(t).ConfigSet(context.Background(), "requirepass", right).Err())
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	site := func(redis string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name secret
		permits 1
		max_wait 5s
		redis %s
		on_store_error fail_closed
	}`, redis))
	}
	t.Setenv("FQ_TEST_REDIS_PASSWORD", right) // inherited by the Caddy processes
	byURL := harness.StartCaddy(t, "wrong-url", site(fmt.Sprintf("redis://:%s@%s/0", wrongURL, rds.Addr())), harness.CaddyOptions{})
	byOpt := harness.StartCaddy(t, "wrong-option", site(fmt.Sprintf("{\n\t\t\taddress %s\n\t\t\tpassword %s\n\t\t}", rds.Addr(), wrongOpt)), harness.CaddyOptions{})
	good := harness.StartCaddy(t, "right-env", site(fmt.Sprintf("{\n\t\t\taddress %s\n\t\t\tpassword {env.FQ_TEST_REDIS_PASSWORD}\n\t\t}", rds.Addr())), harness.CaddyOptions{})
	client := newClient(t)
	ctx := context.Background()

	requireFullStream(t, send(ctx, client, good.URL(), Chat{Stream: true}), 2, "with the right password")
	var answers []string
	for _, c := range []*harness.Caddy{byURL, byOpt} {
		r := send(ctx, client, c.URL(), Chat{})
		requireJSONReject(t, r, http.StatusServiceUnavailable, "store_unavailable")
		answers = append(answers, fmt.Sprint(r.Header), r.Body)
		r = send(ctx, client, c.URL(), Chat{Stream: true})
		requireSSEReject(t, r, "store_unavailable")
		answers = append(answers, fmt.Sprint(r.Header), r.Body)
	}

	for _, c := range []*harness.Caddy{byURL, byOpt, good} {
		for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodPut} {
			req, err := http.NewRequest(method, c.AdminURL()+"/fair_queue/", strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s /fair_queue/ on %s: the admin endpoint is read-only", method, c.Name())
		}
		status, body := getBody(t, c.AdminURL()+"/fair_queue/")
		require.Equal(t, http.StatusOK, status, body)
		assert.Contains(t, body, `"name":"secret"`, "%s admin status", c.Name())
		answers = append(answers, body)
	}
	// The refused ones say why, without the secret.
	_, status := getBody(t, byOpt.AdminURL()+"/fair_queue/")
	assert.Contains(t, status, "WRONGPASS", "the admin endpoint reports the failure")

	// The config API shows the placeholder, not what it stands for.
	_, cfg := getBody(t, good.AdminURL()+"/config/")
	assert.Contains(t, cfg, "{env.FQ_TEST_REDIS_PASSWORD}")
	assert.NotContains(t, cfg, right, "config API")

	// Store errors are logged once the store is marked down (after two
	// failed calls; a failed open is retried once a second).
	for _, c := range []*harness.Caddy{byURL, byOpt} {
		logged := eventually(10*time.Second, func() bool {
			r := send(ctx, client, c.URL(), Chat{})
			answers = append(answers, fmt.Sprint(r.Header), r.Body)
			return strings.Contains(c.Log(), "WRONGPASS")
		})
		assert.True(t, logged, "%s: the refusal is not logged", c.Name())
	}
	for _, c := range []*harness.Caddy{byURL, byOpt, good} {
		answers = append(answers, c.Log())
	}
	for _, text := range answers {
		for _, pw := range []string{right, wrongURL, wrongOpt} {
			assert.NotContains(t, text, pw)
		}
	}
}
