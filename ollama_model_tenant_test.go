package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOllamaModelNamesUntaggedTenantSeesTheModelAsListed: where names
// lists a model without its tag, {http.fair_queue.model} is that name
// (reference.md), for the tenant, weight and priority templates too, not
// only for the queue name and the handlers after: a tenant (or a map to a
// priority or weight) keyed by the model sees "llama3" for either
// spelling, as the operator listed it.
func TestOllamaModelNamesUntaggedTenantSeesTheModelAsListed(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{
		Name: "ollama-t-{http.fair_queue.model}", Names: []string{"ollama-t-llama3"}, Permits: 1,
		Tenant: "{http.fair_queue.model}",
	})
	for _, tc := range []struct{ path, model string }{
		{"/api/chat", "llama3"},
		{"/api/generate", "llama3:latest"},
	} {
		req := newRequest(context.Background(), `{"model":"`+tc.model+`","stream":false}`)
		req.r.URL.Path = tc.path
		req.start(h, okHandler).wait(t)
		require.Equal(t, http.StatusOK, req.w.Code, "%s %s: %s", tc.path, tc.model, req.w.Body.String())
		assert.Equal(t, "ollama-t-llama3", req.placeholder(phQueue), "%s %s", tc.path, tc.model)
		assert.Equal(t, "llama3", req.placeholder(phModel), "%s %s", tc.path, tc.model)
		assert.Equal(t, fairqueue.TenantKey("llama3"), req.placeholder(phTenant),
			"%s %s: the tenant is of another spelling of the model than the placeholder shows", tc.path, tc.model)
	}
}
