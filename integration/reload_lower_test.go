package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Reloads that lower a limit while requests run and others wait, with a
// client leaving mid-answer right after (and a waiting one leaving): the
// aborted request's permit frees under the new limit, and nothing new starts until the requests
// still running are under it. Each case runs with the local store and
// with Redis, and checks that Redis holds no key of the queue once Caddy
// has stopped.

// lowerTokens and lowerDelay shape each answer: long enough that the
// requests running at the reload still run when the client leaves.
const (
	lowerTokens = 12
	lowerDelay  = 150 * time.Millisecond
)

// lowerCase is one reload: the site before and after (store is the
// queue's store line), the requests sent (their headers), how many run
// and wait before the reload, and the most requests of a group (the
// tenant header, "" for all) the upstream may run at once after it.
type lowerCase struct {
	before, after  func(upstream, store string) string
	middle         []func(upstream, store string) string // loads between, in quick succession; a failing one is allowed
	clients        []http.Header
	running, wait  int
	limit          int
	group          string // the header whose value groups requests for limit; "" all one group
	leaveAfterLoad bool   // cancel one running client right after the last load (else right before it)
}

func runLower(t *testing.T, tc lowerCase) {
	eachStore(t, func(t *testing.T, redis bool) {
		store := ""
		var rds *redistest.Server
		if redis {
			rds = redistest.Start(t)
			store = fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", rds.Addr())
		}
		rep := startWatchedReplica(t, "a", mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay})
		c := harness.StartCaddy(t, "caddy", tc.before(rep.addr, store), harness.CaddyOptions{GracePeriod: 30 * time.Second})
		client := newClient(t)
		var all collect
		cancels := make([]context.CancelFunc, len(tc.clients))
		for i, h := range tc.clients {
			ctx, cancel := context.WithCancel(context.Background())
			cancels[i] = cancel
			seq := "c" + strconv.Itoa(i)
			all.send(ctx, client, c.URL(), seq, Chat{Stream: true, Seq: seq, Header: h})
			// One at a time: the first ones run, the others wait in order.
			require.True(t, eventually(10*time.Second, func() bool {
				return len(rep.Arrivals()) >= min(i+1, tc.running) && localStats(t, c, "llm").Waiting >= i+1-tc.running
			}), "client %d not in: %+v", i, localStats(t, c, "llm"))
		}
		require.True(t, eventually(10*time.Second, func() bool {
			return len(rep.Arrivals()) == tc.running && localStats(t, c, "llm").Waiting == tc.wait
		}), "not %d running and %d waiting: %d arrivals, %+v", tc.running, tc.wait, len(rep.Arrivals()), localStats(t, c, "llm"))
		// The client leaving is the first that runs.
		leaver := rep.Arrivals()[0].seq
		li, _ := strconv.Atoi(leaver[1:])
		if !tc.leaveAfterLoad {
			cancels[li]()
		}
		for _, m := range tc.middle {
			if err := c.Load(m(rep.addr, store)); err != nil {
				t.Logf("a load between failed (the config in force stays): %v", err)
			}
		}
		require.NoError(t, c.Load(tc.after(rep.addr, store)))
		loaded := time.Now()
		if tc.leaveAfterLoad {
			cancels[li]()
		}
		// The last client, waiting, leaves too: it must free its place
		// wherever the new shape keeps it.
		waiter := "c" + strconv.Itoa(len(tc.clients)-1)
		cancels[len(tc.clients)-1]()
		results := all.wait(t, 2*time.Minute)
		require.Len(t, results, len(tc.clients))
		for name, r := range results {
			if name == leaver || name == waiter {
				continue
			}
			requireFullStream(t, r, lowerTokens, "client %s", name)
		}
		group := func(seq string) string {
			if tc.group == "" {
				return ""
			}
			i, _ := strconv.Atoi(seq[1:])
			return tc.clients[i].Get(tc.group)
		}
		for _, a := range rep.Arrivals() {
			assert.NotEqual(t, waiter, a.seq, "the waiter that left was served")
			if a.at.Before(loaded) {
				continue
			}
			n := 1
			for _, o := range a.others {
				if o != leaver && o != waiter && group(o) == group(a.seq) {
					n++
				}
			}
			assert.LessOrEqual(t, n, tc.limit, "%s arrived after the reload beside %v (left: %s)", a.seq, a.others, leaver)
		}
		if redis {
			c.Stop()
			assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis")
		}
	})
}

// lowerSite is a queue named llm in front of upstream, with extra lines.
func lowerSite(extra string) func(upstream, store string) string {
	return func(upstream, store string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name llm
		max_wait 60s
		%s
		%s
	}`, extra, store))
	}
}

func headers(n int, tenants ...string) []http.Header {
	out := make([]http.Header, n)
	for i := range out {
		out[i] = http.Header{}
		if len(tenants) > 0 {
			out[i].Set("X-Tenant", tenants[i%len(tenants)])
		}
	}
	return out
}

func TestAReloadThatLowersThePermitsAsAClientLeavesStartsNothingAboveThem(t *testing.T) {
	runLower(t, lowerCase{before: lowerSite("permits 3"), after: lowerSite("permits 1"),
		clients: headers(7), running: 3, wait: 4, limit: 1, leaveAfterLoad: true})
}

func TestAReloadThatLowersTheTenantCapAsAClientLeavesStartsNothingAboveIt(t *testing.T) {
	runLower(t, lowerCase{
		before:  lowerSite("permits 6\n\t\ttenant {header.X-Tenant}\n\t\tmax_in_flight_per_tenant 3"),
		after:   lowerSite("permits 6\n\t\ttenant {header.X-Tenant}\n\t\tmax_in_flight_per_tenant 1"),
		clients: headers(6, "t"), running: 3, wait: 3, limit: 1, group: "X-Tenant", leaveAfterLoad: true})
}

func TestAReloadFromFairToFIFOWithLowerPermitsStartsNothingAboveThem(t *testing.T) {
	runLower(t, lowerCase{
		before:  lowerSite("permits 3\n\t\ttenant {header.X-Tenant}\n\t\tpriority {header.X-Band}"),
		after:   lowerSite("permits 1"),
		clients: headers(7, "a", "b", "c"), running: 3, wait: 4, limit: 1, leaveAfterLoad: true})
}

func TestAReloadFromFIFOToPriorityWithLowerPermitsStartsNothingAboveThem(t *testing.T) {
	runLower(t, lowerCase{
		before:  lowerSite("permits 3"),
		after:   lowerSite("permits 1\n\t\ttenant {header.X-Tenant}\n\t\tpriority {header.X-Band}"),
		clients: headers(7, "a", "b"), running: 3, wait: 4, limit: 1, leaveAfterLoad: true})
}

func TestTwoQuickReloadsAndAFailedOneLowerThePermitsAsAClientLeaves(t *testing.T) {
	runLower(t, lowerCase{
		before: lowerSite("permits 3"),
		middle: []func(upstream, store string) string{
			lowerSite("permits 2"),
			// Fails to provision once its fair_queue has been: the CA file is missing.
			func(upstream, store string) string {
				return fmt.Sprintf(`
	fair_queue {
		name llm
		permits 5
		max_wait 60s
		%s
	}
	reverse_proxy %s {
		transport http {
			tls
			tls_trusted_ca_certs /nonexistent/ca.pem
		}
	}`, store, upstream)
			},
		},
		after:   lowerSite("permits 1"),
		clients: headers(7), running: 3, wait: 4, limit: 1, leaveAfterLoad: true})
}

// kv_tokens lowered below what runs: each request weighs its few prompt
// tokens and default_max_tokens 100; three fit 350, one fits 150.
func TestAReloadThatLowersKVTokensBelowWhatRunsStartsNothingAboveThem(t *testing.T) {
	runLower(t, lowerCase{
		before:  lowerSite("kv_tokens 350\n\t\tdefault_max_tokens 100"),
		after:   lowerSite("kv_tokens 150\n\t\tdefault_max_tokens 100"),
		clients: headers(7), running: 3, wait: 4, limit: 1, leaveAfterLoad: true})
}

// A reload that moves the queue to another store while one request runs
// and five wait; a new request makes the new config serve (the waiters
// move), and a moved waiter's client leaves. Every other client is
// served in full, the upstream never runs two at once, and once Caddy
// stops Redis holds no key of either queue.
func TestAStoreSwitchWhoseMovedWaiterLeavesKeepsThePermitsAndLeavesNoKey(t *testing.T) {
	for _, tc := range []struct{ name, before, after string }{
		{"local to redis", "", "redis {\n\t\t\turl redis://%s/0\n\t\t}"},
		{"redis to local", "redis {\n\t\t\turl redis://%s/0\n\t\t}", ""},
		{"another key prefix", "redis {\n\t\t\turl redis://%s/0\n\t\t}", "redis {\n\t\t\turl redis://%s/0\n\t\t\tkey_prefix other\n\t\t}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rds := redistest.Start(t)
			store := func(f string) string {
				if f == "" {
					return ""
				}
				return fmt.Sprintf(f, rds.Addr())
			}
			rep := startWatchedReplica(t, "a", mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay / 3})
			site := lowerSite("permits 1")
			c := harness.StartCaddy(t, "caddy", site(rep.addr, store(tc.before)), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			var all collect
			cancels := map[string]context.CancelFunc{}
			for i := range 6 {
				ctx, cancel := context.WithCancel(context.Background())
				seq := "c" + strconv.Itoa(i)
				cancels[seq] = cancel
				all.send(ctx, client, c.URL(), seq, Chat{Stream: true, Seq: seq})
				require.True(t, eventually(10*time.Second, func() bool {
					return len(rep.Arrivals()) == 1 && localStats(t, c, "llm").Waiting >= i
				}), "client %d not in: %+v", i, localStats(t, c, "llm"))
			}
			require.NoError(t, c.Load(site(rep.addr, store(tc.after))))
			all.sendAcrossSwap(context.Background(), client, c.URL(), "n0", Chat{Stream: true, Seq: "n0"})
			require.True(t, eventually(10*time.Second, func() bool {
				return waitingIn(t, c, "llm") == 5 // c1..c4 and n0, in either queue
			}), "the new request did not queue")
			cancels["c4"]() // a waiter, moved or on its way
			results := all.wait(t, 2*time.Minute)
			require.Len(t, results, 7)
			for name, r := range results {
				if name != "c4" {
					requireFullStream(t, r, lowerTokens, "client %s", name)
				}
			}
			for _, a := range rep.Arrivals() {
				assert.Empty(t, a.others, "%s arrived beside %v", a.seq, a.others)
				assert.NotEqual(t, "c4", a.seq, "the client that left was served")
			}
			c.Stop()
			assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis")
		})
	}
}

// waitingIn sums the waiters of every queue named name that the admin
// API lists (a retired queue and its successor).
func waitingIn(t *testing.T, c *harness.Caddy, name string) int {
	t.Helper()
	status, body := getBody(t, c.AdminURL()+"/fair_queue/")
	require.Equal(t, http.StatusOK, status, "admin: %s", body)
	var rep struct {
		Queues []struct {
			Name  string      `json:"name"`
			Stats *queueStats `json:"stats"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &rep), "admin: %s", body)
	n := 0
	for _, q := range rep.Queues {
		if q.Name == name && q.Stats != nil {
			n += q.Stats.Waiting
		}
	}
	return n
}

// A reload that reshapes a pool while its requests run and others wait:
// A loses a permit (2 to 1), B gains one (1 to 2), C joins with one, and
// a client running on A leaves right after. A starts nothing while one
// runs there, B never runs above 2, C above 1; everyone else is served.
func TestAReloadThatReshapesAPoolAsAClientLeavesKeepsEachUpstreamWithinItsPermits(t *testing.T) {
	eachStore(t, func(t *testing.T, redis bool) {
		rds := redistest.Start(t)
		store := ""
		if redis {
			store = fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", rds.Addr())
		}
		cfg := mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay}
		a, b, cr := startWatchedReplica(t, "a", cfg), startWatchedReplica(t, "b", cfg), startWatchedReplica(t, "c", cfg)
		pool := func(lines string) string {
			return fmt.Sprintf(`
	fair_queue {
		name llm
		max_wait 60s
		%s
		%s
	}
	reverse_proxy {
		dynamic fair_queue
		flush_interval -1
	}`, lines, store)
		}
		c := harness.StartCaddy(t, "caddy", pool(fmt.Sprintf("upstream %s 2\n\t\tupstream %s 1", a.addr, b.addr)),
			harness.CaddyOptions{GracePeriod: 30 * time.Second})
		client := newClient(t)
		var all collect
		cancels := map[string]context.CancelFunc{}
		for i := range 8 {
			ctx, cancel := context.WithCancel(context.Background())
			seq := "c" + strconv.Itoa(i)
			cancels[seq] = cancel
			all.send(ctx, client, c.URL(), seq, Chat{Stream: true, Seq: seq})
		}
		require.True(t, eventually(10*time.Second, func() bool {
			return len(a.Arrivals()) == 2 && len(b.Arrivals()) == 1 && localStats(t, c, "llm").Waiting == 5
		}), "not 3 running and 5 waiting: %+v", localStats(t, c, "llm"))
		require.NoError(t, c.Load(pool(fmt.Sprintf("upstream %s 1\n\t\tupstream %s 2\n\t\tupstream %s 1", a.addr, b.addr, cr.addr))))
		loaded := time.Now()
		leaver := a.Arrivals()[0].seq
		cancels[leaver]()
		results := all.wait(t, 2*time.Minute)
		require.Len(t, results, 8)
		for name, r := range results {
			if name != leaver {
				requireFullStream(t, r, lowerTokens, "client %s", name)
			}
		}
		for _, x := range []struct {
			r             *watchedReplica
			before, after int
		}{{a, 2, 1}, {b, 1, 2}, {cr, 0, 1}} {
			for _, arr := range x.r.Arrivals() {
				n := 1
				for _, o := range arr.others {
					if o != leaver {
						n++
					}
				}
				limit := x.before
				if !arr.at.Before(loaded) {
					limit = x.after
				}
				assert.LessOrEqual(t, n, limit, "%s arrived at %s beside %v (left: %s)", arr.seq, x.r.name, arr.others, leaver)
			}
		}
		c.Stop()
		assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis")
	})
}

// Two store switches in quick succession while the waiters move: to
// another store and back (the first queue, retired, is still open with
// the old requests in it), or on to a third; with or without a request
// after each load (which makes the new config serve and the waiters
// move). Every client is served in full, the upstream never runs two at
// once, and Redis holds no key once Caddy stops.
func TestTwoQuickStoreSwitchesWhileTheWaitersMoveKeepThePermits(t *testing.T) {
	const local, redisA, redisB = "", "redis {\n\t\t\turl redis://%s/0\n\t\t}", "redis {\n\t\t\turl redis://%s/0\n\t\t\tkey_prefix other\n\t\t}"
	for _, tc := range []struct {
		name    string
		stores  []string
		request bool
	}{
		{"local, redis, local, requests between", []string{local, redisA, local}, true},
		{"local, redis, local", []string{local, redisA, local}, false},
		{"redis, local, redis, requests between", []string{redisA, local, redisA}, true},
		{"redis, other prefix, local, requests between", []string{redisA, redisB, local}, true},
		{"redis, other prefix, redis", []string{redisA, redisB, redisA}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rds := redistest.Start(t)
			store := func(f string) string {
				if f == "" {
					return ""
				}
				return fmt.Sprintf(f, rds.Addr())
			}
			rep := startWatchedReplica(t, "a", mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay / 3})
			site := lowerSite("permits 1")
			c := harness.StartCaddy(t, "caddy", site(rep.addr, store(tc.stores[0])), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			var all collect
			for i := range 6 {
				seq := "c" + strconv.Itoa(i)
				all.send(context.Background(), client, c.URL(), seq, Chat{Stream: true, Seq: seq})
				require.True(t, eventually(10*time.Second, func() bool {
					return len(rep.Arrivals()) == 1 && localStats(t, c, "llm").Waiting >= i
				}), "client %d not in: %+v", i, localStats(t, c, "llm"))
			}
			sent := 6
			for i, s := range tc.stores[1:] {
				require.NoError(t, c.Load(site(rep.addr, store(s))))
				if tc.request {
					seq := "n" + strconv.Itoa(i)
					all.sendAcrossSwap(context.Background(), client, c.URL(), seq, Chat{Stream: true, Seq: seq})
					sent++
					require.True(t, eventually(10*time.Second, func() bool {
						return len(rep.Arrivals())+waitingIn(t, c, "llm") >= sent
					}), "%s did not queue", seq)
				}
			}
			results := all.wait(t, 2*time.Minute)
			require.Len(t, results, sent)
			for name, r := range results {
				requireFullStream(t, r, lowerTokens, "client %s", name)
			}
			for _, a := range rep.Arrivals() {
				assert.Empty(t, a.others, "%s arrived beside %v", a.seq, a.others)
			}
			c.Stop()
			assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis")
		})
	}
}
