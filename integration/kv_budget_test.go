package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// adminKV decodes the kv object of the only queue c's admin API lists
// into v; it reports whether it could.
func adminKV(c *harness.Caddy, v any) bool {
	resp, err := http.Get(c.AdminURL() + "/fair_queue/")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var list struct {
		Queues []struct {
			KV json.RawMessage `json:"kv"`
		} `json:"queues"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil || len(list.Queues) != 1 {
		return false
	}
	return json.Unmarshal(list.Queues[0].KV, v) == nil
}

// Through Caddy: requests that set no max_tokens teach the queue their
// completion budget from the answers' usage (those that set one teach
// it nothing), and the admin API and the metrics show it.
func TestKVCompletionBudgetIsLearnedFromAnswersWithoutMaxTokens(t *testing.T) {
	const generated, answers = 9, 20
	_, _, upstream := startGauged(t, mockllm.Config{Tokens: 2, Delay: time.Millisecond})
	site := proxySite(upstream, `
	fair_queue {
		name kvbudget
		kv_tokens 100000
	}`)
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)
	send := func(body string, tokens int) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, c.URL()+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(mockllm.HeaderTokens, strconv.Itoa(tokens))
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var answer struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, tokens, answer.Usage.CompletionTokens, "the mock's answer length")
	}
	for range answers {
		send(`{"model":"mock","messages":[{"role":"user","content":"hello"}]}`, generated)
	}
	send(`{"model":"mock","max_tokens":500,"messages":[{"role":"user","content":"hello"}]}`, 400) // sets its own

	var kv struct {
		CompletionBudget  int64 `json:"completion_budget"`
		CompletionSamples int64 `json:"completion_samples"`
		TokensHeld        int   `json:"tokens_held"`
	}
	require.True(t, eventually(5*time.Second, func() bool {
		return adminKV(c, &kv) && kv.TokensHeld == 0
	}), "the admin API's kv object (last: %+v)", kv)
	assert.Equal(t, int64(generated), kv.CompletionBudget)
	assert.Equal(t, int64(answers), kv.CompletionSamples, "only the answers to requests without a budget")
	assert.Contains(t, scrape(t, c), fmt.Sprintf(`caddy_fair_queue_kv_completion_budget{queue="kvbudget"} %d`, generated))
}
