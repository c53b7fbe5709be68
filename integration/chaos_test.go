package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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

// The chaos suite's settings.
const (
	chaosQueue   = "chaos"
	chaosPermits = 4
	chaosMaxWait = 4 * time.Second
	chaosLease   = 2 * time.Second
	// chaosClients stream one request after another (4 tokens of 50ms):
	// three times the permits, so that the queue is never empty.
	chaosClients = 12
	// chaosDisconnect clients queue at once and then all leave; at least
	// chaosMinDisconnect must be queued before they would time out.
	chaosDisconnect    = 1000
	chaosMinDisconnect = 300
	// chaosSlack is added to every time bound: three Caddy processes,
	// Redis and a thousand clients share two cores, and the test binary
	// runs with the race detector.
	chaosSlack = 2 * time.Second
	// chaosWindow is how long after a store fault ends its effects may
	// last: a heartbeat (at most Lease/3, at once after an outage) re-
	// registers the running permits, and requests granted by the local
	// queues during the fault (about 200ms each) drain.
	chaosWindow = chaosLease/3 + 2*time.Second
)

// TestChaos runs three Caddy instances sharing one queue in Redis, in
// front of a mock LLM, under continuous streaming load, and breaks
// things while the load runs: it kills one instance holding permits
// (kill -9), restarts Redis (losing its data), freezes Redis (SIGSTOP)
// for 2s, makes a thousand queued clients disconnect at once, and
// reloads the config of every instance. It runs once with
// on_store_error fail_closed and once with local.
//
// Checked throughout:
//   - the permits held in Redis (sampled every 5ms) and the requests at
//     the upstream never exceed the permits, except in the documented
//     windows of a store fault: while Redis is away and for chaosWindow
//     after (and in a phase in which a running instance's lease ran out
//     in Redis, a heartbeat late on a loaded machine), up to 2 x permits
//     (permits granted before a data loss run on while the emptied Redis
//     grants anew, until heartbeats re-register them), plus, with local,
//     the local permits of every instance;
//   - when a thousand clients leave at once, the upstream may for a
//     moment also count requests of departed clients that were granted
//     before their instance noticed they left: the queue released their
//     permits when the proxy gave up, before the upstream noticed the
//     closed connections. The permits held stay within the permits, and
//     the upstream within the permits plus those departed requests;
//   - the permits the dead instance held come back within the lease
//     (2s) plus chaosSlack; waiters it left in the queue may still be
//     granted until its liveness entry expires (a lease after its last
//     call), and those permits are held a lease more, so all its permits
//     are back within twice the lease plus chaosSlack;
//   - every request is granted or rejected within max_wait + 1s (plus
//     chaosSlack) of its arrival;
//   - no queue entry is left once the load ends, and no key once the
//     instances stop.
//
// It takes about 25s per policy on two cores, plus the Caddy build.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("about 50s: skipped with -short")
	}
	for _, policy := range []string{"fail_closed", "local"} {
		t.Run(policy, func(t *testing.T) { runChaos(t, policy) })
	}
}

func runChaos(t *testing.T, policy string) {
	began := time.Now()
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond})
	site := func(poll time.Duration) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name %s
		permits %d
		max_wait %s
		poll_interval %s
		lease %s
		redis {
			url redis://%s/0
		}
		on_store_error %s
	}`, chaosQueue, chaosPermits, chaosMaxWait, poll, chaosLease, rds.Addr(), policy))
	}
	opts := harness.CaddyOptions{GracePeriod: 10 * time.Second} // outlasts max_wait: a reload drops no waiter
	var caddies []*harness.Caddy
	for i := range 3 {
		caddies = append(caddies, harness.StartCaddy(t, "caddy-"+strconv.Itoa(i), site(100*time.Millisecond), opts))
	}
	q := Queue{rdb: rds.Client(t), name: chaosQueue}

	// Outside the fault windows the upstream sees at most the permits;
	// inside, the documented over-admission bound of the policy.
	strict, window := chaosPermits, 2*chaosPermits
	if policy == "local" {
		window += len(caddies) * max(chaosPermits/len(caddies), 1) // the default local_permits of each instance
	}
	// The queue's own count, the permits held in Redis, obeys the same
	// bounds; the upstream's too, except that it also counts requests of
	// clients that left (the queue has released their permits) until it
	// notices their closed connections: departed says how many such
	// requests reached it in the phase.
	held := startHolderSampler(t, q, rds.Addr())
	// A lease that ran out (a heartbeat late on a loaded machine, beside
	// the kill of the victim) is a store fault: its window's bound holds.
	leases, victimNode := startLeaseWatch(t, q, rds.Addr()), ""
	phase := func(name string, bound, departed int) {
		t.Helper()
		if lapsed := leases.take(victimNode); len(lapsed) > 0 && bound == strict {
			t.Logf("%s: a lease ran out in Redis, the bound of a store fault's window holds: %v", name, lapsed)
			bound = window
		}
		h, holders := held.takeHolders()
		m, served := mock.MaxInFlight(), mock.Served()
		t.Logf("%6.1fs %-24s at most %2d at the upstream, %2d permits held (bound %d, departed %d); %d served",
			time.Since(began).Seconds(), name, m, h, bound, departed, served)
		assert.LessOrEqual(t, h, bound, "%s: permits held at once in Redis, the holders %s", name, holders)
		assert.LessOrEqual(t, m, bound+departed, "%s: requests at the upstream at once", name)
		mock.Reset()
	}

	load := startChaosLoad(t, chaosClients, chaosMaxWait+15*time.Second, caddies)
	time.Sleep(2 * time.Second)
	phase("steady", strict, 0)

	// kill -9 an instance holding permits: they come back within the
	// lease. Its running streams die with it, so the upstream stays
	// within the permits meanwhile (the dead permits count as used).
	victim := caddies[2]
	client := newClient(t)
	for range 2 {
		holdPermit(t, client, victim.URL(), nil)
	}
	victimNode = nodeID(t, victim, chaosQueue)
	load.SetTargets(caddies[:2])
	victim.Kill()
	killed := time.Now()
	deadPermits := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ids, err := q.rdb.ZRange(ctx, q.key("holders"), 0, -1).Result()
		require.NoError(t, err)
		var dead []string
		for _, id := range ids {
			if strings.HasPrefix(id, victimNode+":") {
				dead = append(dead, id)
			}
		}
		return dead
	}
	atKill := deadPermits()
	require.NotEmpty(t, atKill, "the killed instance held no permit")
	t.Logf("%6.1fs killed %s (node %s) holding %d permits; their leases end within %v",
		time.Since(began).Seconds(), victim.Name(), victimNode, len(atKill), leaseLeft(t, q, victimNode))
	// The permits it held come back within the lease.
	back := eventually(chaosLease+chaosSlack, func() bool {
		return !slices.ContainsFunc(deadPermits(), func(id string) bool { return slices.Contains(atKill, id) })
	})
	t.Logf("%6.1fs the permits held at the kill came back %v after it (lease %v)",
		time.Since(began).Seconds(), time.Since(killed).Round(time.Millisecond), chaosLease)
	require.True(t, back, "permits held at the kill still held %v after it", time.Since(killed))
	// Its waiters may still be granted until its liveness entry expires
	// (a lease after its last call), each such permit held for a lease:
	// all its permits are back within twice the lease.
	all := eventually(2*chaosLease+chaosSlack-time.Since(killed), func() bool { return len(deadPermits()) == 0 })
	t.Logf("%6.1fs every permit of the killed instance came back %v after the kill",
		time.Since(began).Seconds(), time.Since(killed).Round(time.Millisecond))
	require.True(t, all, "the killed instance still holds %v %v after the kill", deadPermits(), time.Since(killed))
	caddies[2] = harness.StartCaddy(t, "caddy-3", site(100*time.Millisecond), opts)
	load.SetTargets(caddies)
	time.Sleep(time.Second)
	phase("kill -9 and replacement", strict, 0)

	// Redis restarts empty: the running permits are re-registered by
	// the next heartbeats, waiters queued again.
	rds.Restart()
	time.Sleep(chaosWindow)
	phase("redis restart window", window, 0)
	time.Sleep(2 * time.Second)
	phase("after redis restart", strict, 0)

	// Redis hangs for 2s: calls time out, the policy applies.
	rds.Freeze()
	time.Sleep(2 * time.Second)
	rds.Thaw()
	time.Sleep(chaosWindow)
	phase("redis freeze window", window, 0)
	time.Sleep(2 * time.Second)
	phase("after redis freeze", strict, 0)

	// A thousand queued clients leave at once: the queue forgets them
	// at once, and none of them reaches the upstream afterwards.
	departed := disconnectAtOnce(t, q, mock, caddies, chaosDisconnect)
	phase("mass disconnect", strict, departed)

	// Every instance reloads its config (a new poll interval) under load.
	var wg sync.WaitGroup
	errs := make([]error, len(caddies))
	reloadFrom := time.Now()
	for i, c := range caddies {
		wg.Go(func() { errs[i] = c.Load(site(150 * time.Millisecond)) })
	}
	wg.Wait()
	reload := span{reloadFrom.Add(-100 * time.Millisecond), time.Now().Add(time.Second)}
	for i, err := range errs {
		require.NoError(t, err, "reload %s", caddies[i].Name())
	}
	time.Sleep(time.Second)
	phase("reload", strict, 0)

	load.Stop()
	phase("end of load", strict, 0)
	checkChaosResults(t, load.Results(), victim.Name(), reload)

	// Nothing left: no waiter at once, no permit once the leases of
	// permits orphaned by the faults ran out, no key once every
	// instance has left.
	q.awaitWaiting(t, 0, 5*time.Second)
	q.awaitHolders(t, 0, chaosLease+chaosSlack)
	for _, c := range caddies {
		c.Stop()
	}
	assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis after every instance stopped")
	t.Logf("%6.1fs done", time.Since(began).Seconds())
}

// leaseLeft returns the longest time left on the leases of node's
// permits, by Redis' clock.
func leaseLeft(t *testing.T, q Queue, node string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := q.rdb.Time(ctx).Result()
	require.NoError(t, err)
	holders, err := q.rdb.ZRangeWithScores(ctx, q.key("holders"), 0, -1).Result()
	require.NoError(t, err)
	var left time.Duration
	for _, h := range holders {
		if id, _ := h.Member.(string); strings.HasPrefix(id, node+":") {
			left = max(left, time.UnixMilli(int64(h.Score)).Sub(now))
		}
	}
	return left
}

// disconnectAtOnce queues n streaming clients over the instances, waits
// until they are queued (at least chaosMinDisconnect of them, if the
// machine is too slow to queue all before they would time out), cancels
// them all at once and checks that the queue lets them go at once and
// that none reaches the upstream a moment later. It returns how many of
// them reached the upstream in all.
func disconnectAtOnce(t *testing.T, q Queue, mock *mockllm.Server, caddies []*harness.Caddy, n int) (departed int) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	gone := func() int {
		k := 0
		for _, s := range mock.Arrivals() {
			if strings.HasPrefix(s, "gone-") {
				k++
			}
		}
		return k
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		c := caddies[i%len(caddies)]
		wg.Go(func() { send(ctx, client, c.URL(), Chat{Stream: true, Seq: "gone-" + strconv.Itoa(i)}) })
	}
	// Queued: every one is waiting or was served. The load's own waiters
	// count too, so this may fire a dozen clients early; those leave
	// before they queue.
	eventually(chaosMaxWait-time.Second, func() bool { return q.Waiting(t)+gone() >= n })
	waiting := q.Waiting(t)
	t.Logf("%d clients sent in %v: %d waiting, %d served; all leave now", n, time.Since(start).Round(time.Millisecond), waiting, gone())
	require.GreaterOrEqual(t, waiting, chaosMinDisconnect, "clients queued within %v", chaosMaxWait-time.Second)

	cancel()
	left := time.Now()
	// The load's clients stay: at most one waiter each.
	empty := eventually(2*time.Second+chaosSlack, func() bool { return q.Waiting(t) <= chaosClients })
	t.Logf("queue down to %d waiting %v after the disconnect", q.Waiting(t), time.Since(left).Round(time.Millisecond))
	require.True(t, empty, "%d tickets still waiting %v after %d clients left", q.Waiting(t), time.Since(left), n)
	wg.Wait()
	// A grant racing the disconnect may still reach the upstream for a
	// moment; after that, none of the departed does.
	time.Sleep(500 * time.Millisecond)
	reached := gone()
	time.Sleep(time.Second)
	assert.Equal(t, reached, gone(), "departed clients reached the upstream after they left")
	return gone()
}

// checkChaosResults checks every request of the load: each was answered
// (granted or rejected) within max_wait + 1s + slack of its arrival; only
// requests to the killed instance failed; each reject carries a reason.
// span is a stretch of time.
type span struct{ from, to time.Time }

func (w span) holds(at time.Time) bool { return !at.Before(w.from) && !at.After(w.to) }

// checkChaosResults checks every request of the load. A connection that
// Caddy closes without an answer while its config is swapped (the old
// server stops accepting as the new one starts) is Caddy's reload, not
// the queue: at most a few are tolerated inside the reload window.
func checkChaosResults(t *testing.T, results []loadResult, victim string, reload span) {
	t.Helper()
	bound := chaosMaxWait + time.Second + chaosSlack
	var granted, full, failedAtVictim, cutByReload int
	var worst time.Duration
	reasons := make(map[string]int)
	for _, r := range results {
		switch {
		case r.err != nil && r.caddy == victim:
			failedAtVictim++ // its connections died with it
			continue
		case r.err != nil && r.status == 0 && reload.holds(r.start) && cutByReload < 5:
			cutByReload++
			t.Logf("connection closed by the config swap: %s", r)
			continue
		case r.err != nil:
			t.Errorf("request failed: %s", r)
			continue
		case r.reason != "":
			reasons[r.reason]++
		case r.status == http.StatusOK:
			granted++
			if r.full {
				full++
			} else {
				t.Errorf("granted stream cut short: %s", r)
			}
		default:
			t.Errorf("unexpected answer: %s", r)
		}
		worst = max(worst, r.answer)
		if r.answer > bound {
			t.Errorf("answered %v after arrival, later than max_wait + 1s + slack (%v): %s", r.answer.Round(time.Millisecond), bound, r)
		}
	}
	t.Logf("%d requests: %d granted (%d streams whole), rejects %v, %d failed with the killed instance; slowest answer %v (bound %v)",
		len(results), granted, full, reasons, failedAtVictim, worst.Round(time.Millisecond), bound)
	assert.Greater(t, granted, 100, "requests granted: the load ran")
}
