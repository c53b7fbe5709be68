package caddyfairqueue

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// With tenant {client_ip} and no trusted_proxies, a client's
// X-Forwarded-For (or X-Real-IP) does not choose its tenant: every
// request of one address is that address's tenant, whatever it sends.
func TestAForwardedForHeaderDoesNotChooseTheTenant(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	for range 10 {
		up.release <- struct{}{}
	}
	url := runCaddy(t, `{"handler":"fair_queue","name":"forwarded-for","permits":1,"tenant":"{http.vars.client_ip}"}`,
		`{"handler":"headers","response":{"set":{"X-Tenant":["{http.fair_queue.tenant}"]}}}`, up.proxy())
	for _, forged := range []map[string]string{
		{}, {"X-Forwarded-For": "10.1.2.3"}, {"X-Forwarded-For": "10.1.2.3, 127.0.0.1"}, {"X-Real-IP": "10.9.9.9"},
		{"Forwarded": "for=10.1.2.3"},
	} {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		for k, v := range forged {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, fairqueue.TenantKey("127.0.0.1"), resp.Header.Get("X-Tenant"), "the tenant of a request with %v", forged)
	}
}
