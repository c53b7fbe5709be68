package systems

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCaddyConfigPutsFairQueueBeforeReverseProxy(t *testing.T) {
	t.Parallel()
	e := &Env{MockAddr: "127.0.0.1:9", RedisAddr: "127.0.0.1:7", Permits: 4, MaxWait: time.Minute}
	for _, tc := range []struct {
		spec     Spec
		handlers []string
		redis    bool
	}{
		{Spec{Name: "caddy", Kind: KindPlain}, []string{"reverse_proxy"}, false},
		{Spec{Name: "fq-local", Kind: KindFairQueue}, []string{"fair_queue", "reverse_proxy"}, false},
		{Spec{Name: "fq-redis-1", Kind: KindFairQueue, Redis: true}, []string{"fair_queue", "reverse_proxy"}, true},
	} {
		data, err := e.caddyConfig("127.0.0.1:8", tc.spec, "q")
		require.NoError(t, err)
		srv := benchServer(t, data)
		assert.Equal(t, []string{"127.0.0.1:8"}, srv.Listen)
		require.Len(t, srv.Routes, 1)
		var names []string
		for _, h := range srv.Routes[0].Handle {
			names = append(names, h["handler"].(string))
		}
		assert.Equal(t, tc.handlers, names, tc.spec.Name)
		if tc.spec.Kind == KindFairQueue {
			fq := srv.Routes[0].Handle[0]
			assert.EqualValues(t, 4, fq["permits"])
			assert.Equal(t, "1m0s", fq["max_wait"])
			_, hasRedis := fq["redis"]
			assert.Equal(t, tc.redis, hasRedis, tc.spec.Name)
		}
	}
}

func TestHAProxyConfigLimitsTheServerToThePermits(t *testing.T) {
	t.Parallel()
	e := &Env{MockAddr: "127.0.0.1:9", Permits: 4, MaxWait: time.Minute}
	cfg := e.haproxyConfig("127.0.0.1:8")
	assert.Contains(t, cfg, "server s1 127.0.0.1:9 maxconn 4")
	assert.Contains(t, cfg, "timeout queue 60000ms")
	assert.Contains(t, cfg, "bind 127.0.0.1:8")
	assert.Contains(t, cfg, "option http-no-delay")
}

func TestPoolConfigsGiveEachReplicaThePermits(t *testing.T) {
	env := &Env{MockAddr: "127.0.0.1:1", Pool: []string{"127.0.0.1:1", "127.0.0.1:2"}, Permits: 16, MaxWait: time.Minute}
	cfg := env.haproxyConfig("127.0.0.1:9")
	assert.Contains(t, cfg, "server s1 127.0.0.1:1 maxconn 16\n")
	assert.Contains(t, cfg, "server s2 127.0.0.1:2 maxconn 16\n")

	data, err := env.caddyConfig("127.0.0.1:9", Spec{Kind: KindFairQueue, Nodes: 1}, "q")
	require.NoError(t, err)
	js := string(data)
	assert.Contains(t, js, `"dial": "127.0.0.1:2",`)
	assert.Contains(t, js, `"permits": 16`)
	assert.Contains(t, js, `"source": "fair_queue"`)
	assert.NotContains(t, js, `"permits": 32`, "the pool's sum is the default")

	env.Pool = nil
	data, err = env.caddyConfig("127.0.0.1:9", Spec{Kind: KindFairQueue, Nodes: 1}, "q")
	require.NoError(t, err)
	assert.NotContains(t, string(data), "dynamic_upstreams")
	assert.Contains(t, env.haproxyConfig("127.0.0.1:9"), "server s1 127.0.0.1:1 maxconn 16\n")
}

func TestKVTokensGoToTheQueueOrEachPoolUpstream(t *testing.T) {
	env := &Env{MockAddr: "127.0.0.1:1", Permits: 64, MaxWait: time.Minute, KVTokens: []int{48000}}
	data, err := env.caddyConfig("127.0.0.1:9", Spec{Kind: KindFairQueue, Nodes: 1}, "q")
	require.NoError(t, err)
	assert.Contains(t, string(data), `"kv_tokens": 48000`)
	env.Pool, env.KVTokens = []string{"127.0.0.1:1", "127.0.0.1:2"}, []int{48000, 32000}
	data, err = env.caddyConfig("127.0.0.1:9", Spec{Kind: KindFairQueue, Nodes: 1}, "q")
	require.NoError(t, err)
	assert.Regexp(t, `"dial": "127.0.0.1:2",\s*"kv_tokens": 32000`, string(data))
	assert.Equal(t, 2, strings.Count(string(data), `"kv_tokens"`), "each upstream's, not the queue's")
}

func TestDefaultMaxTokensAndTheStatusPageAreSetOnlyWhenAsked(t *testing.T) {
	env := &Env{MockAddr: "127.0.0.1:1", Permits: 64, MaxWait: time.Minute, KVTokens: []int{48000}}
	data, err := env.caddyConfig("127.0.0.1:9", Spec{Kind: KindFairQueue, Nodes: 1}, "q")
	require.NoError(t, err)
	assert.NotContains(t, string(data), "default_max_tokens", "unset: the queue learns the budget")
	assert.NotContains(t, string(data), "fair_queue_status")
	env.DefaultMaxTokens, env.Status = 1024, true
	data, err = env.caddyConfig("127.0.0.1:9", Spec{Kind: KindFairQueue, Nodes: 1}, "q")
	require.NoError(t, err)
	assert.Contains(t, string(data), `"default_max_tokens": 1024`)
	routes := benchServer(t, data).Routes
	require.Len(t, routes, 2)
	assert.Equal(t, []string{StatusPath}, routes[0].Match[0]["path"], "the status page first, on its path only")
	assert.Equal(t, "fair_queue_status", routes[0].Handle[0]["handler"])
	assert.Equal(t, "fair_queue", routes[1].Handle[0]["handler"])
	data, err = env.caddyConfig("127.0.0.1:9", Spec{Kind: KindPlain, Nodes: 1}, "q")
	require.NoError(t, err)
	assert.NotContains(t, string(data), "fair_queue", "a plain node has no queue to show")
}

func TestCaddyfileIsAnOperatorsDefaultConfig(t *testing.T) {
	t.Parallel()
	e := &Env{MockAddr: "127.0.0.1:9", RedisAddr: "127.0.0.1:7", Permits: 4, MaxWait: time.Minute}
	got := e.caddyConfigFile("127.0.0.1:8080", "127.0.0.1:2999", Spec{Kind: KindFairQueue, Redis: true, Caddyfile: true}, "bench-x")
	assert.Equal(t, `{
	admin 127.0.0.1:2999
	persist_config off
}

:8080 {
	route {
		fair_queue {
			name bench-x
			permits 4
			max_wait 1m0s
			redis redis://127.0.0.1:7/0
		}
		reverse_proxy 127.0.0.1:9
	}
}
`, got)
	plain := e.caddyConfigFile("127.0.0.1:8080", "127.0.0.1:2999", Spec{Kind: KindPlain, Caddyfile: true}, "q")
	assert.NotContains(t, plain, "fair_queue")
	assert.Contains(t, plain, "reverse_proxy 127.0.0.1:9")
}

func TestCaddyConfigSetsTenantAndCost(t *testing.T) {
	t.Parallel()
	e := &Env{MockAddr: "127.0.0.1:9", RedisAddr: "127.0.0.1:7", Permits: 2, MaxWait: time.Minute}
	for _, tc := range []struct {
		spec         Spec
		tenant, cost any
	}{
		{Spec{Name: "fair-fifo", Kind: KindFairQueue, Redis: true}, nil, nil},
		{Spec{Name: "fair-time", Kind: KindFairQueue, Redis: true, Tenant: tenantPlaceholder, Cost: "time"}, tenantPlaceholder, "time"},
	} {
		data, err := e.caddyConfig("127.0.0.1:8", tc.spec, "q")
		require.NoError(t, err)
		fq := benchServer(t, data).Routes[0].Handle[0]
		assert.Equal(t, tc.tenant, fq["tenant"], tc.spec.Name)
		assert.Equal(t, tc.cost, fq["cost"], tc.spec.Name)
	}
}

// tenantPlaceholder is the fairness scenario's tenant (scenario.TenantPlaceholder).
const tenantPlaceholder = "{http.request.header.X-Tenant}"

// server is the part of a Caddy JSON config's HTTP server the tests read.
type server struct {
	Listen []string `json:"listen"`
	Routes []struct {
		Match  []map[string][]string `json:"match"`
		Handle []map[string]any      `json:"handle"`
	} `json:"routes"`
}

// benchServer is the server "bench" of the Caddy JSON config data.
func benchServer(t *testing.T, data []byte) server {
	t.Helper()
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]server `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	require.NoError(t, json.Unmarshal(data, &cfg))
	return cfg.Apps.HTTP.Servers["bench"]
}
