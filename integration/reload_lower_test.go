package integration

import (
	"context"
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
		// The first ones run, held, until all are in: on a loaded
		// machine queueing them may take longer than an answer.
		release := rep.hold(t)
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
		release()
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
		// The first three run, held, until all eight are in and the new
		// config is in force: nothing ends under the old config once the
		// load is sent, so every arrival from then on is the new config's
		// grant. It may come before the load's answer: the new config
		// grants B's and C's new permits as it takes over.
		releaseA, releaseB := a.hold(t), b.hold(t)
		cancels := all.sendStreams(client, c.URL(), 8)
		require.True(t, eventually(10*time.Second, func() bool {
			return len(a.Arrivals()) == 2 && len(b.Arrivals()) == 1 && localStats(t, c, "llm").Waiting == 5
		}), "not 3 running and 5 waiting: %+v", localStats(t, c, "llm"))
		loaded := time.Now()
		require.NoError(t, c.Load(pool(fmt.Sprintf("upstream %s 1\n\t\tupstream %s 2\n\t\tupstream %s 1", a.addr, b.addr, cr.addr))))
		releaseA()
		releaseB()
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
