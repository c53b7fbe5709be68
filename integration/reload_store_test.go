package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Store switches (local <-> Redis, another key_prefix) with waiters
// that move, leave, or move twice, and pools reshaped on the way; see
// reload_lower_test.go for the timings.
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
			t.Parallel()
			rds := redistest.Start(t)
			store := storeBlocks(rds)
			rep := startWatchedReplica(t, "a", mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay / 3})
			site := lowerSite("permits 1")
			c := harness.StartCaddy(t, "caddy", site(rep.addr, store(tc.before)), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			var all collect
			cancels := map[string]context.CancelFunc{}
			// c0 runs, held, until all six are in: on a loaded machine
			// queueing them may take longer than an answer.
			release := rep.hold(t)
			for i := range 6 {
				ctx, cancel := context.WithCancel(context.Background())
				seq := "c" + strconv.Itoa(i)
				cancels[seq] = cancel
				all.send(ctx, client, c.URL(), seq, Chat{Stream: true, Seq: seq})
				require.True(t, eventually(10*time.Second, func() bool {
					return len(rep.Arrivals()) == 1 && localStats(t, c, "llm").Waiting >= i
				}), "client %d not in: %+v", i, localStats(t, c, "llm"))
			}
			release()
			require.NoError(t, c.Load(site(rep.addr, store(tc.after))))
			all.sendAcrossSwap(context.Background(), client, c.URL(), "n0", Chat{Stream: true, Seq: "n0"})
			require.True(t, eventually(10*time.Second, func() bool {
				// Seven sent: n0 is in once they have arrived or wait,
				// in either queue.
				return len(rep.Arrivals())+waitingIn(t, c, "llm") >= 7
			}), "the new request did not queue")
			cancels["c4"]() // a waiter, moved or on its way
			results := all.wait(t, 2*time.Minute)
			require.Len(t, results, 7)
			for name, r := range results {
				if name != "c4" {
					requireFullStream(t, r, lowerTokens, "client %s", name)
				}
			}
			// c4 may be granted as its client leaves: the moved waiters
			// enter the new queue at its tail in the order they move, so
			// it may be next when c0 ends. It then runs alone, as any.
			for _, a := range rep.Arrivals() {
				assert.Empty(t, a.others, "%s arrived beside %v", a.seq, a.others)
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
			t.Parallel()
			rds := redistest.Start(t)
			store := storeBlocks(rds)
			rep := startWatchedReplica(t, "a", mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay / 3})
			site := lowerSite("permits 1")
			c := harness.StartCaddy(t, "caddy", site(rep.addr, store(tc.stores[0])), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			var all collect
			release := rep.hold(t) // c0 runs, held, until all six are in
			for i := range 6 {
				seq := "c" + strconv.Itoa(i)
				all.send(context.Background(), client, c.URL(), seq, Chat{Stream: true, Seq: seq})
				require.True(t, eventually(10*time.Second, func() bool {
					return len(rep.Arrivals()) == 1 && localStats(t, c, "llm").Waiting >= i
				}), "client %d not in: %+v", i, localStats(t, c, "llm"))
			}
			release()
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
			stopped := time.Now()
			c.Stop()
			if !assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis") {
				// Which queue the registry still names, and when its
				// instance last named it, against the stop.
				z, _ := rds.Client(t).ZRangeWithScores(context.Background(), "{fair_queue}:queues", 0, -1).Result()
				t.Logf("registry after the stop: %+v (Caddy stopped at %d ms)", z, stopped.UnixMilli())
			}
		})
	}
}

// A reload that moves a pool to another store and reshapes it at once:
// A leaves the pool, C joins, B stays (one permit each), while a request
// runs on A and one on B and four wait; B's client leaves right after.
// The old requests count on their upstreams in the new queue: no
// upstream runs two at once, A gets nothing new, and every other client
// is served.
func TestAStoreSwitchThatReshapesAPoolKeepsEachUpstreamWithinItsPermits(t *testing.T) {
	for _, tc := range []struct{ name, before, after string }{
		{"local to redis", "", "redis {\n\t\t\turl redis://%s/0\n\t\t}"},
		{"redis to local", "redis {\n\t\t\turl redis://%s/0\n\t\t}", ""},
		{"another key prefix", "redis {\n\t\t\turl redis://%s/0\n\t\t}", "redis {\n\t\t\turl redis://%s/0\n\t\t\tkey_prefix other\n\t\t}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rds := redistest.Start(t)
			store := storeBlocks(rds)
			cfg := mockllm.Config{Tokens: lowerTokens, Delay: lowerDelay}
			a, b, cr := startWatchedReplica(t, "a", cfg), startWatchedReplica(t, "b", cfg), startWatchedReplica(t, "c", cfg)
			pool := func(x, y *watchedReplica, f string) string {
				return fmt.Sprintf(`
	fair_queue {
		name llm
		max_wait 60s
		upstream %s 1
		upstream %s 1
		%s
	}
	reverse_proxy {
		dynamic fair_queue
		flush_interval -1
	}`, x.addr, y.addr, store(f))
			}
			c := harness.StartCaddy(t, "caddy", pool(a, b, tc.before), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			var all collect
			// The first two run, held, until all six are in.
			releaseA, releaseB := a.hold(t), b.hold(t)
			cancels := all.sendStreams(client, c.URL(), 6)
			require.True(t, eventually(10*time.Second, func() bool {
				return len(a.Arrivals()) == 1 && len(b.Arrivals()) == 1 && localStats(t, c, "llm").Waiting == 4
			}), "not 2 running and 4 waiting: %+v", localStats(t, c, "llm"))
			releaseA()
			releaseB()
			// n0 must reach the new config (Load returns once the old
			// config's listener has closed): its first request moves the
			// waiters out of the old queue, which would grant them on A.
			require.NoError(t, c.Load(pool(b, cr, tc.after)))
			loaded := time.Now()
			all.sendAcrossSwap(context.Background(), client, c.URL(), "n0", Chat{Stream: true, Seq: "n0"})
			leaver := b.Arrivals()[0].seq
			cancels[leaver]()
			results := all.wait(t, 2*time.Minute)
			require.Len(t, results, 7)
			for name, r := range results {
				if name != leaver {
					requireFullStream(t, r, lowerTokens, "client %s", name)
				}
			}
			for _, x := range []*watchedReplica{a, b, cr} {
				for _, arr := range x.Arrivals() {
					others := slices.DeleteFunc(slices.Clone(arr.others), func(o string) bool { return o == leaver })
					assert.Empty(t, others, "%s arrived at %s beside %v", arr.seq, x.name, arr.others)
					if x == a {
						assert.True(t, arr.at.Before(loaded), "%s reached A, out of the pool", arr.seq)
					}
				}
			}
			c.Stop()
			assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis")
		})
	}
}

// Waiters keep the max_wait they arrived with across reloads that
// change it, the store, or both, twice: a holder runs 10 s, three
// waiters of a 2 s max_wait are answered timeout (not served once the
// holder ends, under a later config's 60 s), and the new config's
// request waits its own max_wait and is served.
func TestWaitersKeepTheirMaxWaitAcrossQuickStoreSwitches(t *testing.T) {
	const local, redisA, redisB = "", "redis {\n\t\t\turl redis://%s/0\n\t\t}", "redis {\n\t\t\turl redis://%s/0\n\t\t\tkey_prefix other\n\t\t}"
	for _, tc := range []struct {
		name   string
		stores []string
	}{
		{"same store", []string{local, local, local}},
		{"local, redis, other prefix", []string{local, redisA, redisB}},
		{"redis, local, redis", []string{redisA, local, redisA}},
		{"local, redis, local", []string{local, redisA, local}},
		{"redis, local, other prefix", []string{redisA, local, redisB}},
		{"redis, other prefix, redis", []string{redisA, redisB, redisA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rds := redistest.Start(t)
			store := storeBlocks(rds)
			rep := startWatchedReplica(t, "a", mockllm.Config{Tokens: 4, Delay: 10 * time.Millisecond})
			site := func(maxWait, s string) string {
				return proxySite(rep.addr, fmt.Sprintf(`
	fair_queue {
		name llm
		permits 1
		max_wait %s
		%s
	}`, maxWait, store(s)))
			}
			c := harness.StartCaddy(t, "caddy", site("2s", tc.stores[0]), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			var all collect
			all.send(context.Background(), client, c.URL(), "holder", Chat{Stream: true, Seq: "holder", Tokens: 50, Delay: 200 * time.Millisecond})
			require.True(t, eventually(10*time.Second, func() bool { return len(rep.Arrivals()) == 1 }), "the holder did not start")
			for i := range 3 {
				seq := "w" + strconv.Itoa(i)
				all.send(context.Background(), client, c.URL(), seq, Chat{Seq: seq})
			}
			require.True(t, eventually(10*time.Second, func() bool {
				return localStats(t, c, "llm").Waiting == 3
			}), "the waiters did not queue: %+v", localStats(t, c, "llm"))
			for i, s := range tc.stores[1:] {
				require.NoError(t, c.Load(site("60s", s)))
				seq := "n" + strconv.Itoa(i)
				all.sendAcrossSwap(context.Background(), client, c.URL(), seq, Chat{Seq: seq})
			}
			results := all.wait(t, 2*time.Minute)
			require.Len(t, results, 6)
			requireFullStream(t, results["holder"], 50, "the holder")
			for i := range 3 {
				requireJSONReject(t, results["w"+strconv.Itoa(i)], http.StatusTooManyRequests, "timeout")
			}
			for _, n := range []string{"n0", "n1"} {
				if r := results[n]; r.Status == 0 && swapReset(r.Err) {
					// Cut twice by the listener swaps of the two reloads
					// back to back (sent again once): Caddy's, before any
					// handler saw it, as the chaos tests allow.
					continue
				}
				assert.Equal(t, http.StatusOK, results[n].Status, "%s: %s", n, results[n])
			}
			for _, a := range rep.Arrivals() {
				assert.Empty(t, a.others, "%s arrived beside %v", a.seq, a.others)
			}
			c.Stop()
			assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis")
		})
	}
}

// storeBlocks fills a store block of the cases (a format naming rds'
// address, or "" for the in-process store) with rds' address.
func storeBlocks(rds *redistest.Server) func(string) string {
	return func(f string) string {
		if f == "" {
			return ""
		}
		return fmt.Sprintf(f, rds.Addr())
	}
}
