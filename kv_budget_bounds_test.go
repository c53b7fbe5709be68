package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// An upstream whose usage reports more completion tokens than any count
// (a buggy server, 1e300) teaches the queue the largest budget, as a
// body's max_tokens past it saturates: the budget does not wrap around
// to a negative number and fall to 1 token, which would weigh every
// request that sets none as generating nothing and overfill the cache.
func TestLearnedBudgetSaturatesAtAnAnswerPastAnyTokenCount(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1e300,"total_tokens":1e300}}`)
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t, `{"handler":"fair_queue","name":"budget-huge-usage","kv_tokens":100000}`,
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.URL, "http://")))
	for range budgetMinSamples {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	var kv *kvReport
	require.Eventually(t, func() bool {
		for _, q := range queueStatus(t.Context()).Queues {
			if q.Name == "budget-huge-usage" && q.KV != nil && q.KV.CompletionSamples == budgetMinSamples {
				kv = q.KV
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond, "the %d answers are learned", budgetMinSamples)
	assert.Equal(t, int64(jsonscan.MaxTokenCount), kv.CompletionBudget, "saturated, as a body's budget is")
}
