package integration

import (
	"context"
	"fmt"
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

// Two instances, each given a different seed node of a 3-master Redis
// Cluster, share one queue: the upstream sees exactly the permits, and
// once the instances stop nothing is left on any master.
func TestInstancesShareAQueueOnARedisCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond})
	site := func(seed string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name on-cluster
		permits 2
		max_wait 60s
		redis {
			mode cluster
			address %s
		}
	}`, seed))
	}
	var caddies []*harness.Caddy
	for i, seed := range cluster.Addrs()[:2] {
		caddies = append(caddies, harness.StartCaddy(t, "caddy-"+strconv.Itoa(i), site(seed), harness.CaddyOptions{}))
	}
	client := newClient(t)
	var all collect
	const clients = 16
	for i := range clients {
		all.send(context.Background(), client, caddies[i%2].URL(), strconv.Itoa(i), Chat{Stream: true})
	}
	results := all.wait(t, 3*time.Minute)
	require.Len(t, results, clients)
	for name, r := range results {
		requireFullStream(t, r, 4, "client %s", name)
	}
	assert.Equal(t, 2, mock.MaxInFlight(), "requests at the upstream at once")
	assert.NotEmpty(t, cluster.Keys(t, "{fair_queue:on-cluster}:*"), "the queue lives in the cluster")
	for _, c := range caddies {
		c.Stop()
	}
	assert.Empty(t, cluster.Keys(t, "*"), "keys left in the cluster after every instance stopped")
}

// Two instances queue on a master found through Redis Sentinel, under
// continuous streaming load with on_store_error fail_closed. The master
// is killed mid-load: while the Sentinels fail over, requests are
// rejected with store_unavailable (none hangs past max_wait + 1s), and
// on the promoted replica the permits hold again. A failover can lose
// the last writes (asynchronous replication): a grant lost that way is
// unknown to the new master until its request ends, so just after the
// failover the upstream may see up to twice the permits; once the
// requests of that moment (200ms each here) are done, never more than
// the permits.
func TestInstancesFollowASentinelFailoverMidLoad(t *testing.T) {
	s := redistest.StartSentinel(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond})
	const permits = 3
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name on-sentinel
		permits %d
		max_wait %s
		poll_interval 100ms
		lease %s
		redis {
			mode sentinel
			master_name %s
			address %s
		}
		on_store_error fail_closed
	}`, permits, chaosMaxWait, chaosLease, s.MasterName(), strings.Join(s.SentinelAddrs(), " ")))
	var caddies []*harness.Caddy
	for i := range 2 {
		caddies = append(caddies, harness.StartCaddy(t, "caddy-"+strconv.Itoa(i), site, harness.CaddyOptions{}))
	}
	began := time.Now()
	phase := func(name string, bound int) {
		t.Helper()
		m, served := mock.MaxInFlight(), mock.Served()
		t.Logf("%6.1fs %-20s at most %d at the upstream (bound %d), %d served", time.Since(began).Seconds(), name, m, bound, served)
		assert.LessOrEqual(t, m, bound, "%s: requests at the upstream at once", name)
		mock.Reset()
	}

	load := startChaosLoad(t, 9, chaosMaxWait+15*time.Second, caddies)
	time.Sleep(2 * time.Second)
	phase("before the failover", permits)

	old := s.MasterAddr()
	killed := time.Now()
	addr := s.KillMaster()
	t.Logf("failover from %s to %s took %v", old, addr, time.Since(killed).Round(time.Millisecond))
	before := mock.Served()
	resumed := eventually(20*time.Second, func() bool { return mock.Served() > before })
	require.True(t, resumed, "nothing served after the failover")
	t.Logf("serving again %v after the kill", time.Since(killed).Round(time.Millisecond))
	time.Sleep(chaosWindow)
	phase("failover window", 2*permits)
	time.Sleep(3 * time.Second)
	phase("after the failover", permits)

	load.Stop()
	var granted int
	reasons := make(map[string]int)
	bound := chaosMaxWait + time.Second + chaosSlack
	for _, r := range load.Results() {
		require.NoError(t, r.err, "request: %s", r)
		if r.reason != "" {
			reasons[r.reason]++
		} else if assert.True(t, r.full, "granted stream cut short: %s", r) {
			granted++
		}
		assert.LessOrEqual(t, r.answer, bound, "answered later than max_wait + 1s + slack: %s", r)
	}
	t.Logf("%d granted, rejects %v", granted, reasons)
	assert.Positive(t, reasons["store_unavailable"], "requests during the failover")
	for r := range reasons {
		assert.Contains(t, []string{"store_unavailable", "timeout"}, r)
	}
}
