package fairqueue_test

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// ticketFlow is how the store's scripts read a ticket's flow back from
// its ID, "<node>:<counter>:<flow>" (tenant_of in redisstore's
// lua/common.lua).
var ticketFlow = regexp.MustCompile(`^[^:]*:[^:]*:(.+)$`)

// FuzzTenantKey checks that any tenant value, an API key or other client
// input, becomes a fixed-length lowercase hex key: the value itself never
// reaches the store, and no separator in it (':' of ticket IDs, '.' of
// flows) can change how a ticket ID is read back.
func FuzzTenantKey(f *testing.F) {
	for _, s := range []string{"", "Bearer sk-secret", "a:b", "::", "x.3", "{fair_queue:q}:waiting", "\xff\x00\n\r", "ünïcödé"} {
		f.Add(s)
	}
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	f.Fuzz(func(t *testing.T, tenant string) {
		key := fairqueue.TenantKey(tenant)
		require.Regexp(t, hex16, key, "tenant %q", tenant)
		assert.Equal(t, key, fairqueue.TenantKey(tenant), "the key is deterministic")
		if tenant != "" {
			assert.NotEqual(t, fairqueue.TenantKey(""), key, "a tenant is not the default tenant")
		}
		flow := key + ".3"
		m := ticketFlow.FindStringSubmatch("0123456789abcdef:1z:" + flow)
		require.NotNil(t, m)
		assert.Equal(t, flow, m[1], "the flow read back from the ticket ID")
	})
}
