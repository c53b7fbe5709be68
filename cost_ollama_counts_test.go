package caddyfairqueue

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Ollama answer whose counts are not both counts (a negative
// eval_count from a buggy server) has no usage, as an OpenAI usage with
// a negative total has none: cost tokens keeps its estimate, rather
// than charging the sum, which a negative count brings below the
// prompt's own tokens, down to nothing.
func TestCostTokensKeepsItsEstimateForANegativeOllamaCount(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h, charged := costHandler(t, "cost-ollama-negative", CostTokens, &Handler{MaxCost: 100000})
	for _, tc := range []struct{ name, contentType, answer string }{
		{"NDJSON", "application/x-ndjson", "{\"done\":false,\"message\":{\"content\":\"hi\"}}\n" +
			"{\"done\":true,\"prompt_eval_count\":100,\"eval_count\":-100}\n"},
		{"JSON", "application/json", `{"done":true,"prompt_eval_count":-50,"eval_count":60}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", tc.contentType)
				_, _ = io.WriteString(w, tc.answer)
			})))
			req, err := http.NewRequest(http.MethodPost, srv.url+"/api/chat", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
			require.NoError(t, err)
			req.Header.Set("X-Tenant", "a")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.Equal(t, outcomeGranted, srv.outcome(t))
			settled(t, h)
			select {
			case used := <-charged:
				assert.Fail(t, "charged the answer's counts", "charged %v", used)
			default: // the charge runs before the release, which settled saw
			}
		})
	}
}
