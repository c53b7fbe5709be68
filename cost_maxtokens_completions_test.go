package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With cost max_tokens a request is charged what it may generate: its
// max_tokens for each completion it asks for ("n", "best_of", a batch
// of prompts), as kv_tokens and cost tokens weigh it. A client that
// asks for 50 completions of 100 tokens may generate 5,000: charged 100
// (its max_tokens alone), it was served as often as a tenant fifty
// times lighter, and took fifty times its share of the backend.
func TestCostMaxTokensChargesEachCompletionAClientAsksFor(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tag := r.Header.Get("X-Tag")
		mu.Lock()
		order = append(order, tag)
		mu.Unlock()
		if tag == "blocker" {
			<-release
		}
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	const name = "cost-max-tokens-n"
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"1m",
			"tenant":"{http.request.header.X-Tenant}","cost":"max_tokens"}`, name),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(upstream.URL, "http://")))

	send := func(tenant, tag, body string) <-chan int {
		done := make(chan int, 1)
		go func() {
			req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
			if err != nil {
				done <- 0
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Tenant", tenant)
			req.Header.Set("X-Tag", tag)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	blocker := send("z", "blocker", `{"model":"m","prompt":"x","max_tokens":1}`)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 1
	}, 10*time.Second, 5*time.Millisecond, "the blocker reaches the upstream")

	// Tenant a asks for 50 completions of 100 tokens (5,000 at most),
	// tenant b for one of 1,000; each sends two, in turn.
	many := `{"model":"m","prompt":"x","max_tokens":100,"n":50}`
	one := `{"model":"m","prompt":"x","max_tokens":1000}`
	var answers []<-chan int
	for i, r := range []struct{ tenant, tag, body string }{
		{"a", "a1", many}, {"b", "b1", one}, {"a", "a2", many}, {"b", "b2", one},
	} {
		answers = append(answers, send(r.tenant, r.tag, r.body))
		waitQueueWaiting(t, name, i+1)
	}
	close(release)
	require.Equal(t, http.StatusOK, <-blocker)
	for _, a := range answers {
		require.Equal(t, http.StatusOK, <-a)
	}
	mu.Lock()
	defer mu.Unlock()
	// a1 first (both flows start level), then b1; then a has been
	// charged 5,000 and b 1,000: b goes again before a.
	assert.Equal(t, []string{"blocker", "a1", "b1", "b2", "a2"}, order,
		"a request of n completions is charged max_tokens for each")
}

// The charge of cost max_tokens as each API reads a body: Ollama's
// native API generates one completion whatever "n" says; a product
// beyond max_cost is max_cost, however large its factors.
func TestCostMaxTokensChargeAsEachAPIReadsTheBody(t *testing.T) {
	h := fairHandler(t, &Handler{Tenant: "t", Cost: CostMaxTokens, MaxCost: 32768})
	for _, tc := range []struct {
		name string
		a    api
		body string
		want float64
	}{
		{"one completion", apiOpenAI, `{"max_tokens":100}`, 100},
		{"n completions", apiOpenAI, `{"max_tokens":100,"n":50}`, 5000},
		{"best_of", apiOpenAI, `{"max_tokens":100,"best_of":4,"n":2}`, 400},
		{"a batch of prompts", apiOpenAI, `{"max_tokens":100,"prompt":["a","b","c"]}`, 300},
		{"no budget", apiOpenAI, `{"n":50}`, 50},
		{"beyond max_cost", apiOpenAI, `{"max_tokens":1000,"n":1000}`, 32768},
		{"saturated factors", apiOpenAI, `{"max_tokens":9007199254740993,"n":9007199254740993}`, 32768},
		{"Ollama's native API reads no n", apiOllamaChat, `{"options":{"num_predict":100},"n":50}`, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, h.requestCost(tc.a.sniff([]byte(tc.body))))
		})
	}
	// A native /generate: TGI's best_of, SGLang's n and batch.
	for body, want := range map[string]float64{
		`{"inputs":"x","parameters":{"max_new_tokens":100,"best_of":4}}`:    400,
		`{"text":["a","b"],"sampling_params":{"max_new_tokens":100,"n":3}}`: 600,
	} {
		assert.Equal(t, want, h.requestCost(asGenerate(apiOpenAI.sniff([]byte(body)))), body)
	}
}
