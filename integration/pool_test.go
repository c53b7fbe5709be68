package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// replica is one mock model server of a pool, on a fixed address so that
// it can be stopped and started again where the pool's config names it.
type replica struct {
	t    *testing.T
	mock *mockllm.Server
	addr string
	srv  *httptest.Server
}

// startReplica starts a mock replica on a free port.
func startReplica(t *testing.T, cfg mockllm.Config) *replica {
	t.Helper()
	r := &replica{t: t, mock: mockllm.New(cfg), addr: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))}
	r.start()
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *replica) start() {
	r.t.Helper()
	var ln net.Listener
	var err error
	ok := eventually(5*time.Second, func() bool {
		ln, err = net.Listen("tcp", r.addr)
		return err == nil
	})
	require.True(r.t, ok, "listen on %s: %v", r.addr, err)
	r.srv = httptest.NewUnstartedServer(r.mock.Handler())
	r.srv.Listener.Close()
	r.srv.Listener = ln
	r.srv.Start()
}

// stop closes the listener and every connection, as a crashed server.
func (r *replica) stop() {
	if r.srv != nil {
		r.srv.CloseClientConnections()
		r.srv.Close()
		r.srv = nil
	}
}

// poolSite is a site block with a fair_queue pool of the replicas (each
// with its permits) in Redis at redisAddr, and reverse_proxy sending each
// request to its granted upstream.
func poolSite(redisAddr string, replicas []*replica, permits []int, options ...string) string {
	var b strings.Builder
	b.WriteString("\tfair_queue {\n\t\tname pool\n\t\tmax_wait 60s\n")
	for i, r := range replicas {
		fmt.Fprintf(&b, "\t\tupstream %s %d\n", r.addr, permits[i])
	}
	for _, o := range options {
		fmt.Fprintf(&b, "\t\t%s\n", o)
	}
	fmt.Fprintf(&b, "\t\tredis {\n\t\t\turl redis://%s/0\n\t\t}\n\t}\n", redisAddr)
	b.WriteString("\treverse_proxy {\n\t\tdynamic fair_queue\n\t\tflush_interval -1\n\t}")
	return b.String()
}

// Three instances on one Redis, three replicas of 1, 2 and 3 permits:
// under a burst each replica runs exactly its permits at once, never
// more, and every request is served.
func TestPoolCapsEachReplicaAcrossInstances(t *testing.T) {
	rds := redistest.Start(t)
	permits := []int{1, 2, 3}
	var replicas []*replica
	for range permits {
		replicas = append(replicas, startReplica(t, mockllm.Config{Tokens: 8, Delay: 50 * time.Millisecond}))
	}
	site := poolSite(rds.Addr(), replicas, permits)
	var caddies []*harness.Caddy
	for i := range 3 {
		caddies = append(caddies, harness.StartCaddy(t, fmt.Sprintf("caddy-%d", i), site, harness.CaddyOptions{}))
	}
	client := newClient(t)
	const clients, tokens = 48, 8
	var all collect
	start := time.Now()
	for i := range clients {
		all.send(context.Background(), client, caddies[i%3].URL(), strconv.Itoa(i), Chat{Stream: true})
	}
	results := all.wait(t, 3*time.Minute)
	drain := time.Since(start)
	require.Len(t, results, clients)
	for name, r := range results {
		requireFullStream(t, r, tokens, "client %s", name)
	}
	served := 0
	for i, r := range replicas {
		assert.Equal(t, permits[i], r.mock.MaxInFlight(), "replica %d (permits %d): requests at once", i, permits[i])
		served += r.mock.Served()
		t.Logf("replica %d (permits %d): served %d", i, permits[i], r.mock.Served())
	}
	assert.Equal(t, clients, served, "requests served by the replicas")
	// 48 requests of 400ms on 6 permits: 8 rounds, 3.2s without handoffs.
	t.Logf("drain of %d requests: %v (capacity bound %v)", clients, drain.Round(time.Millisecond), 8*400*time.Millisecond)
	q := Queue{rdb: rds.Client(t), name: "pool"}
	assert.Zero(t, q.Waiting(t), "tickets left waiting")
	q.awaitHolders(t, 0, 10*time.Second) // released after the answer (engine.finish)
}

// A replica that answers 503 with Retry-After to its first requests,
// requeue_on 503: no client sees a 503, every request is served, and the
// other replica takes the load meanwhile.
func TestRequeueOn503HidesTheRefusalFromClients(t *testing.T) {
	rds := redistest.Start(t)
	const refusals = 3
	sick := startReplica(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond, Refuse: refusals, RetryAfter: "1"})
	healthy := startReplica(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond})
	site := poolSite(rds.Addr(), []*replica{sick, healthy}, []int{2, 2}, "requeue_on 429 503", "max_requeues 5")
	var caddies []*harness.Caddy
	for i := range 2 {
		caddies = append(caddies, harness.StartCaddy(t, fmt.Sprintf("caddy-%d", i), site, harness.CaddyOptions{}))
	}
	client := newClient(t)
	const clients = 16
	var all collect
	for i := range clients {
		all.send(context.Background(), client, caddies[i%2].URL(), strconv.Itoa(i), Chat{Stream: i%2 == 0})
	}
	results := all.wait(t, 3*time.Minute)
	require.Len(t, results, clients)
	for name, r := range results {
		require.NoError(t, r.Err, "client %s", name)
		require.Equal(t, http.StatusOK, r.Status, "client %s: %s", name, r)
		if n, _ := strconv.Atoi(name); n%2 == 0 {
			requireFullStream(t, r, 4, "client %s", name)
		}
	}
	assert.Equal(t, refusals, sick.mock.Stats().Refused, "refusals of the sick replica")
	assert.Equal(t, clients, sick.mock.Served()+healthy.mock.Served(), "requests served")
	assert.Greater(t, healthy.mock.Served(), sick.mock.Served(), "the healthy replica took the load")
	assert.LessOrEqual(t, sick.mock.MaxInFlight(), 2)
	assert.LessOrEqual(t, healthy.mock.MaxInFlight(), 2)

	// The requeues and the cooldowns are counted per upstream.
	metrics := scrape(t, caddies[0], caddies[1])
	assert.Contains(t, metrics, fmt.Sprintf(`upstream="%s"`, sick.addr))
	assert.Equal(t, refusals, sumMetric(metrics, "caddy_fair_queue_requeues_total", `reason="503"`, `upstream="`+sick.addr+`"`), "requeues counted")
	q := Queue{rdb: rds.Client(t), name: "pool"}
	q.awaitHolders(t, 0, 10*time.Second) // released after the answer (engine.finish)
}

// A replica killed under load: the streams it was running are cut (they
// had started), every other request is served, by the other replica
// (the waiters granted on the dead one are requeued: it cannot be
// reached, and it cools); when it comes back it gets work again.
func TestKilledReplicaIsCooledAndComesBack(t *testing.T) {
	rds := redistest.Start(t)
	cfg := mockllm.Config{Tokens: 8, Delay: 50 * time.Millisecond}
	a, b := startReplica(t, cfg), startReplica(t, cfg)
	site := poolSite(rds.Addr(), []*replica{a, b}, []int{2, 2}, "upstream_cooldown 300ms", "max_requeues 20")
	caddies := []*harness.Caddy{harness.StartCaddy(t, "caddy-0", site, harness.CaddyOptions{}), harness.StartCaddy(t, "caddy-1", site, harness.CaddyOptions{})}
	client := newClient(t)
	q := Queue{rdb: rds.Client(t), name: "pool"}

	const clients = 16
	var all collect
	for i := range clients {
		all.send(context.Background(), client, caddies[i%2].URL(), strconv.Itoa(i), Chat{Stream: true})
	}
	require.True(t, eventually(30*time.Second, func() bool { return a.mock.InFlight() == 2 && q.Waiting(t) > 4 }),
		"replica a busy and a queue waiting")
	cut := a.mock.InFlight()
	servedBefore := a.mock.Served()
	a.stop()
	results := all.wait(t, 3*time.Minute)
	require.Len(t, results, clients)
	broken := 0
	for name, r := range results {
		if r.Err != nil || !strings.Contains(r.Body, "data: [DONE]") {
			broken++
			t.Logf("client %s: cut: %s", name, r)
			continue
		}
		requireFullStream(t, r, 8, "client %s", name)
	}
	assert.LessOrEqual(t, broken, cut, "only the streams running on the killed replica are cut")
	assert.Equal(t, clients-broken, servedBefore+b.mock.Served(), "every other request served")
	assert.LessOrEqual(t, b.mock.MaxInFlight(), 2)
	metrics := scrape(t, caddies...)
	assert.Positive(t, sumMetric(metrics, "caddy_fair_queue_requeues_total", `reason="unreachable"`, `upstream="`+a.addr+`"`),
		"waiters granted on the dead replica were requeued")

	a.start()
	ok := eventually(30*time.Second, func() bool {
		r := send(context.Background(), client, caddies[0].URL(), Chat{Stream: true, Tokens: 1})
		return r.Err == nil && r.Status == http.StatusOK && a.mock.Served() > servedBefore
	})
	assert.True(t, ok, "the replica back gets work again (served %d)", a.mock.Served())
	q.awaitHolders(t, 0, 10*time.Second) // released after the answer (engine.finish)
}

// scrape reads the Prometheus metrics of each instance (its admin
// endpoint's /metrics), joined.
func scrape(t *testing.T, caddies ...*harness.Caddy) string {
	t.Helper()
	var b strings.Builder
	for _, c := range caddies {
		resp, err := http.Get(c.AdminURL() + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "metrics of %s", c.Name())
		b.Write(body)
	}
	return b.String()
}

// sumMetric adds the values of the samples of name whose labels contain
// every one of labels.
func sumMetric(metrics, name string, labels ...string) int {
	sum := 0.0
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(set, l)
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil && all {
			sum += v
		}
	}
	return int(sum)
}
