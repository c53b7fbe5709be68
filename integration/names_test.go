package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
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

// junkNames is how many made-up model names a hostile client sends: more
// than the queues one handler holds (maxQueuesPerHandler, 100).
const junkNames = 120

// sendModel sends a chat completion for model to base and reads the
// whole answer.
func sendModel(t *testing.T, client *http.Client, base, model string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return Result{Err: err, Done: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err, Done: time.Now()}
}

// perModelSite is a site with one queue per model in rds; more holds
// further fair_queue options.
func perModelSite(rds *redistest.Server, upstream, more string) string {
	return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name {http.fair_queue.model}
		permits 1
		max_wait 5s
		redis redis://%s/0
		%s
	}`, rds.Addr(), more))
}

// A client that sends requests with made-up model names, more of them
// than a handler holds queues, never keeps a real model out: the queues
// it opened are idle once its requests are answered, and a new name
// takes the slot of one. Once idle for 10s they leave Redis: no key of a
// made-up name is left.
func TestMadeUpModelNamesNeverLockOutARealOne(t *testing.T) {
	t.Parallel() // its own Caddy, upstream and Redis: it waits on them, not on the CPU
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	c := harness.StartCaddy(t, "per-model", perModelSite(rds, upstream, ""), harness.CaddyOptions{})
	client := newClient(t)

	for i := range junkNames {
		r := sendModel(t, client, c.URL(), "junk-"+strconv.Itoa(i))
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusOK, r.Status, "junk %d: %s", i, r)
	}
	require.NotEmpty(t, rds.Keys(t, "*junk-*"), "the made-up names had queues in Redis")

	r := sendModel(t, client, c.URL(), "real-model")
	require.NoError(t, r.Err)
	assert.Equal(t, http.StatusOK, r.Status, "the real model after %d made-up ones: %s", junkNames, r)

	// Idle queues leave the store (10s idle, plus a margin for a loaded machine).
	gone := eventually(40*time.Second, func() bool { return len(rds.Keys(t, "*junk-*")) == 0 })
	assert.True(t, gone, "keys of idle made-up queues left in Redis: %d, e.g. %v", len(rds.Keys(t, "*junk-*")), first(rds.Keys(t, "*junk-*"), 5))
}

// With names, a made-up model is answered 404 model_not_found at once and
// opens no queue: nothing of it reaches Redis, and the listed model is
// served.
func TestUnlistedModelNamesAreAnswered404AndNeverOpenAQueue(t *testing.T) {
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	c := harness.StartCaddy(t, "listed", perModelSite(rds, upstream, "names real-model other-model"), harness.CaddyOptions{})
	client := newClient(t)

	for i := range junkNames {
		r := sendModel(t, client, c.URL(), "junk-"+strconv.Itoa(i))
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusNotFound, r.Status, "junk %d: %s", i, r)
		var e apiError
		require.NoError(t, json.Unmarshal([]byte(r.Body), &e), "body %q", r.Body)
		require.Equal(t, "model_not_found", e.Error.Code, "body %q", r.Body)
	}
	assert.Empty(t, rds.Keys(t, "*"), "a made-up name reached Redis")
	assert.Zero(t, mock.Served(), "a made-up name reached the upstream")

	r := sendModel(t, client, c.URL(), "real-model")
	require.NoError(t, r.Err)
	assert.Equal(t, http.StatusOK, r.Status, "the listed model: %s", r)
	for _, k := range rds.Keys(t, "*") {
		if k == redisstore.RegistryKey("") {
			continue
		}
		assert.True(t, strings.HasPrefix(k, "{fair_queue:real-model}:"), "key %q of another queue", k)
	}
	assert.Equal(t, []string{"real-model"}, registryNames(t, rds, ""), "the registry of queues")
}

// registryNames lists the queues the registry of prefix names.
func registryNames(t *testing.T, rds *redistest.Server, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names, err := rds.Client(t).ZRange(ctx, redisstore.RegistryKey(prefix), 0, -1).Result()
	require.NoError(t, err)
	return names
}

// first returns at most n elements of s.
func first(s []string, n int) []string { return s[:min(n, len(s))] }
