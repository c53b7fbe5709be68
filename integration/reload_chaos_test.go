package integration

import (
	"fmt"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The reload chaos test's settings. RELOAD_CHAOS_RELOADS and
// RELOAD_CHAOS_SEED override the number of reloads and the seed (make
// soak runs many); RELOAD_CHAOS_STRICT=1 also checks what today's code
// is known to break (see reloadChaosStrict).
const (
	reloadChaosQueue   = "llm"
	reloadChaosMaxWait = 4 * time.Second
	reloadChaosTokens  = 4
	reloadChaosDelay   = 40 * time.Millisecond
	reloadChaosReloads = 10
	// reloadChaosReplicas are the mock replicas of each group.
	reloadChaosReplicas = 3
	// reloadChaosWindow is how long a replaced config may still bound
	// the upstreams after every instance has the next one (see allowed).
	reloadChaosWindow = time.Second
	// reloadChaosGap bounds the random time between two reloads.
	reloadChaosGap = 1500 * time.Millisecond
	// reloadChaosSwapCuts is how many connections a reload's config
	// swap may reset before they are answered (Caddy's listener swap,
	// not the queue; TestChaos allows the same).
	reloadChaosSwapCuts = 2
)

// reloadChaosStrict (RELOAD_CHAOS_STRICT=1) lets the configs take every
// shape and checks what today's code is known to break; by default the
// test guards the rest: the cluster's configs are pools (resized,
// upstreams added and removed) in one key prefix; the lone instance's
// are a pool or a static reverse_proxy to any replica, in its local store
// or either of two key prefixes (pools added and removed, static routes
// moved, the store switched). Strict mode also gives the cluster static
// routes and moves it between two key prefixes. Known to fail there
// (docs/operations.md, "Lifecycle"):
//   - a static reverse_proxy moved from A to B in a cluster: an instance
//     already reloaded grants another's waiter of the old config, still
//     in force there, under the new permits, and it runs on A (the store
//     counts the queue, not a static route's upstream: a pool does);
//   - the cluster moving to another key prefix: each instance counts
//     only its own old requests (namesakes.go), so another instance's
//     old holders and the new queue's grants together exceed the
//     permits.
func reloadChaosStrict() bool { return os.Getenv("RELOAD_CHAOS_STRICT") == "1" }

// reloadChaosGroup is a set of Caddy instances serving one queue in
// front of their own replicas, reloaded together: two instances on one
// Redis (the store switch changes the key prefix), or one instance that
// also moves between its local store and Redis.
type reloadChaosGroup struct {
	name     string
	prefixes []string // the stores a config picks from ("" local)
	static   bool     // configs may be a static reverse_proxy (else pools only)
	redis    string   // the Redis address
	clients  int
	caddies  []*harness.Caddy
	replicas []*watchedReplica
	load     *reloadChaosLoad

	mu     sync.Mutex
	epochs []reloadChaosEpoch
}

// epoch returns the number of the latest config loaded.
func (g *reloadChaosGroup) epoch() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.epochs) - 1
}

func (g *reloadChaosGroup) addEpoch(e reloadChaosEpoch) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.epochs = append(g.epochs, e)
}

// TestReloadChaosNeverRunsAnUpstreamAboveThePermitsInForce reloads random
// configs of one queue, on two instances sharing a Redis and on one
// instance of its own, while closed-loop clients send plain and
// streamed requests and some cancel theirs while waiting or streaming.
// A config changes permits (up and down), lease, the pool (added,
// removed, resized, or a static reverse_proxy to one replica), the store
// (key prefix; local store and Redis for the lone instance), tenant,
// cost, max_in_flight_per_tenant and requeue_on.
//
// Checked:
//   - no arrival at a replica makes it run more than the highest limit
//     it had in any config in force during the second before (the old
//     config's requests still running count; those whose client had
//     already left are not counted: the abort grace is
//     TestDepartedClientsNeverReachTheUpstream's);
//   - every request is served whole, rejected with a fair_queue reason
//     in a well-formed answer, or cancelled by its client;
//   - once every instance has stopped, Redis holds no key.
//
// A failure prints its seed; RELOAD_CHAOS_SEED reruns its configs.
func TestReloadChaosNeverRunsAnUpstreamAboveThePermitsInForce(t *testing.T) {
	if testing.Short() {
		t.Skip("about 25s: skipped with -short")
	}
	seed, reloads := time.Now().UnixNano(), reloadChaosReloads
	if v := os.Getenv("RELOAD_CHAOS_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseInt(v, 10, 64)
		require.NoError(t, err, "RELOAD_CHAOS_SEED")
	}
	if v := os.Getenv("RELOAD_CHAOS_RELOADS"); v != "" {
		var err error
		reloads, err = strconv.Atoi(v)
		require.NoError(t, err, "RELOAD_CHAOS_RELOADS")
	}
	strict := reloadChaosStrict()
	t.Logf("seed %d, %d reloads, strict %t (rerun: RELOAD_CHAOS_SEED=%d)", seed, reloads, strict, seed)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: rerun with RELOAD_CHAOS_SEED=%d RELOAD_CHAOS_RELOADS=%d RELOAD_CHAOS_STRICT=%d",
				seed, seed, reloads, map[bool]int{false: 0, true: 1}[strict])
		}
	}()
	rng := rand.New(rand.NewSource(seed))
	rds := redistest.Start(t)
	harness.CaddyBinary(t) // built before the clock starts
	began := time.Now()
	t.Logf("time 0 is %s", began.Format("15:04:05.000"))
	clusterPrefixes, clusterStatic, soloPrefixes := []string{"rc"}, false, []string{"", "rs", "rs2"}
	if strict {
		clusterPrefixes, clusterStatic = []string{"rc", "rc2"}, true
	}

	groups := []*reloadChaosGroup{
		{name: "cluster", prefixes: clusterPrefixes, static: clusterStatic, redis: rds.Addr(), clients: 8},
		{name: "solo", prefixes: soloPrefixes, static: true, redis: rds.Addr(), clients: 6},
	}
	opts := harness.CaddyOptions{GracePeriod: 30 * time.Second} // outlasts max_wait: a reload drops no request
	for gi, g := range groups {
		for i := range reloadChaosReplicas {
			g.replicas = append(g.replicas, startWatchedReplica(t, fmt.Sprintf("%s-r%d", g.name, i),
				mockllm.Config{Tokens: reloadChaosTokens, Delay: reloadChaosDelay}))
		}
		cfg := randomReloadChaosConfig(rng, reloadChaosReplicas, g.prefixes, g.static)
		from := time.Now()
		for i := range map[string]int{"cluster": 2, "solo": 1}[g.name] {
			g.caddies = append(g.caddies, harness.StartCaddy(t, fmt.Sprintf("%s-%d", g.name, i), cfg.site(g.replicas, g.redis), opts))
		}
		g.addEpoch(reloadChaosEpoch{cfg: cfg, from: from, applied: time.Now()})
		t.Logf("%6.2fs %s starts with #0 %s", time.Since(began).Seconds(), g.name, cfg)
		g.load = startReloadChaosLoad(t, g.name, seed+int64(1000*(gi+1)), g.clients, g.caddies, g.epoch)
	}

	for n := range reloads {
		time.Sleep(reloadChaosGap/4 + time.Duration(rng.Int63n(int64(reloadChaosGap*3/4))))
		var wg sync.WaitGroup
		for _, g := range groups {
			cfg := randomReloadChaosConfig(rng, reloadChaosReplicas, g.prefixes, g.static)
			wg.Go(func() { g.reload(t, cfg, began, n) })
		}
		wg.Wait()
	}
	time.Sleep(reloadChaosGap)
	for _, g := range groups {
		g.load.Stop()
	}
	t.Logf("%6.2fs load stopped", time.Since(began).Seconds())
	for _, g := range groups {
		g.checkAnswers(t)
		g.checkLimits(t, began, strict)
	}

	// Every instance leaves; the last of a queue deletes its keys.
	for _, g := range groups {
		for _, c := range g.caddies {
			c.Stop()
		}
	}
	assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis after every instance stopped")
	t.Logf("%6.2fs done", time.Since(began).Seconds())
}

// reload loads cfg on every instance of the group at once and records
// the epoch.
func (g *reloadChaosGroup) reload(t *testing.T, cfg reloadChaosConfig, began time.Time, n int) {
	from := time.Now()
	errs := make([]error, len(g.caddies))
	var wg sync.WaitGroup
	for i, c := range g.caddies {
		wg.Go(func() { errs[i] = c.Load(cfg.site(g.replicas, g.redis)) })
	}
	wg.Wait()
	g.addEpoch(reloadChaosEpoch{cfg: cfg, from: from, applied: time.Now()})
	t.Logf("%6.2fs %s reload to #%d (%v): %s", from.Sub(began).Seconds(), g.name, n+1, time.Since(from).Round(time.Millisecond), cfg)
	for i, err := range errs {
		assert.NoError(t, err, "reload %d of %s", n+1, g.caddies[i].Name())
	}
}

// checkAnswers checks that every request of the group got a well-formed
// answer or was cancelled by its client.
func (g *reloadChaosGroup) checkAnswers(t *testing.T) {
	t.Helper()
	kinds := make(map[string]int)
	bad := 0
	requests := g.load.Requests()
	seqs := make([]string, 0, len(requests))
	for s := range requests {
		seqs = append(seqs, s)
	}
	sort.Strings(seqs)
	cuts := 0
	for _, s := range seqs {
		q := requests[s]
		kind, why := q.verdict(reloadChaosTokens)
		if why != "" && cuts < reloadChaosSwapCuts*(len(g.epochs)-1) && g.cutBySwap(q) {
			cuts++
			t.Logf("%s: connection cut by a reload's config swap: %s", g.name, q)
			continue
		}
		if why != "" {
			bad++
			if bad <= 20 {
				t.Errorf("%s: not a well-formed answer (%s): %s", g.name, why, q)
			}
			continue
		}
		kinds[kind]++
	}
	t.Logf("%s: %d requests: %v, %d bad", g.name, len(requests), kinds, bad)
	assert.Greater(t, kinds["served"], 50, "%s: requests served: the load ran", g.name)
}

// cutBySwap reports whether q failed before any answer, as a
// connection that a config swap resets does, while a reload of its
// group ran.
func (g *reloadChaosGroup) cutBySwap(q *reloadChaosRequest) bool {
	if q.Err == nil || q.Status != 0 || !strings.Contains(q.Err.Error(), "connection reset") && !strings.Contains(q.Err.Error(), "EOF") {
		return false
	}
	for _, e := range g.epochs[1:] {
		if q.sent.After(e.from.Add(-100*time.Millisecond)) && q.sent.Before(e.applied.Add(100*time.Millisecond)) {
			return true
		}
	}
	return false
}

// checkLimits checks every arrival at the group's replicas against the
// limits of the configs in force (see allowed).
func (g *reloadChaosGroup) checkLimits(t *testing.T, began time.Time, strict bool) {
	t.Helper()
	storeGrace := time.Duration(0)
	requests := g.load.Requests()
	served := g.servedAfter(requests)
	for i, r := range g.replicas {
		peak, over := 0, 0
		for _, a := range r.Arrivals() {
			live := []string{a.seq}
			for _, s := range a.others {
				// A request whose client had left before this arrival
				// runs on only until the replica notices.
				if q, ok := requests[s]; ok && !q.canceled.IsZero() && q.canceled.Before(a.at) {
					continue
				}
				live = append(live, s)
			}
			peak = max(peak, len(live))
			most, in := allowed(g.epochs, i, a.at, reloadChaosWindow, storeGrace, served)
			if len(live) <= most {
				continue
			}
			over++
			if over > 5 {
				continue
			}
			var cfgs []string
			for _, k := range in {
				e := g.epochs[k]
				cfgs = append(cfgs, fmt.Sprintf("#%d %s (loaded %.2fs-%.2fs)", k, e.cfg,
					e.from.Sub(began).Seconds(), e.applied.Sub(began).Seconds()))
			}
			sort.Strings(live)
			t.Errorf("%s: %s ran %d at once at %.3fs, above %d, the most of the configs in force in the %v before:\n\t%s\n\trunning: %s",
				g.name, r.name, len(live), a.at.Sub(began).Seconds(), most, reloadChaosWindow,
				strings.Join(cfgs, "\n\t"), strings.Join(g.describe(requests, live), "\n\t\t"))
		}
		t.Logf("%s: %s: %d arrivals, at most %d at once (clients still there), %d above the limit",
			g.name, r.name, len(r.Arrivals()), peak, over)
	}
}

// servedAfter returns when every instance of the group had been sent a
// request at or after a moment (the latest of their first such
// requests; zero if one had none): by then each has served a request of
// the config it had.
func (g *reloadChaosGroup) servedAfter(requests map[string]*reloadChaosRequest) func(time.Time) time.Time {
	sent := make(map[string][]time.Time)
	for _, q := range requests {
		sent[q.caddy] = append(sent[q.caddy], q.sent)
	}
	for _, ts := range sent {
		slices.SortFunc(ts, time.Time.Compare)
	}
	return func(after time.Time) time.Time {
		var last time.Time
		for _, c := range g.caddies {
			ts := sent[c.Name()]
			j, _ := slices.BinarySearchFunc(ts, after, time.Time.Compare)
			if j == len(ts) {
				return time.Time{}
			}
			if ts[j].After(last) {
				last = ts[j]
			}
		}
		return last
	}
}

// describe says, for each request named by seqs, what it was.
func (g *reloadChaosGroup) describe(requests map[string]*reloadChaosRequest, seqs []string) []string {
	out := make([]string, 0, len(seqs))
	for _, s := range seqs {
		if q, ok := requests[s]; ok {
			out = append(out, q.String())
		} else {
			out = append(out, s)
		}
	}
	return out
}
