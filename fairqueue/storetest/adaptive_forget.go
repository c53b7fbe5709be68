package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A pool whose dials change on every deploy (configs generated with pod
// IPs): the store keeps what it learned of an upstream only while some
// node of the queue has it in its pool.
func init() {
	cases = append(cases,
		testCase{"LearnedSharesOfUpstreamsNoNodeHasAreForgotten", learnedForget},
		testCase{"LearnedSharesOfANewPoolStayFromItsReload", learnedAfterReload},
	)
}

// deployPool is the pool of deploy i: two upstreams of their own.
func deployPool(i int) []fairqueue.Upstream {
	return []fairqueue.Upstream{{Dial: fmt.Sprintf("10.0.%d.1:8000", i), Permits: 2}, {Dial: fmt.Sprintf("10.0.%d.2:8000", i), Permits: 2}}
}

func dialsOf(ups []fairqueue.Upstream) []string {
	out := make([]string, len(ups))
	for i, u := range ups {
		out[i] = u.Dial
	}
	return out
}

// learnOn makes q grant on every upstream of ups (a last grant each) and
// learn a share below 1 for each (a breach reported).
func learnOn(t *testing.T, q *fairqueue.Queue, ups []fairqueue.Upstream) {
	t.Helper()
	var held []*fairqueue.Permit
	for range ups {
		p, err := q.Acquire(bg, fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	for _, p := range held {
		p.Release()
	}
	eventually(t, 10*time.Second, func() bool {
		for _, u := range ups {
			q.ObserveTTFT(u.Dial, time.Second) // above the target: reported at most once per interval
		}
		time.Sleep(20 * time.Millisecond)
		sh := q.Shares()
		for _, u := range ups {
			if s, ok := sh[u.Dial]; !ok || s >= 1 {
				return false
			}
		}
		return true
	}, "no share learned for %v: %v", dialsOf(ups), q.Shares())
}

// RedeployPool runs queue name on two nodes with Config.Adaptive and a
// pool of two upstreams, through deploys that each replace both
// upstreams by new dials, one node after the other (a rolling deploy):
// every upstream is granted on and learns a share. It checks that an
// upstream the node not yet redeployed still has keeps its share. It
// returns the nodes and the dials in force at the end, for the caller
// to check what the store still keeps.
func RedeployPool(t *testing.T, h Harness, name string, deploys int) (nodes []*fairqueue.Queue, inForce []string) {
	t.Helper()
	cfg := fairqueue.Config{Upstreams: deployPool(0), MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Lease:    3 * time.Second,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	a, b := h.NewNode(t, name, cfg), h.NewNode(t, name, cfg)
	learnOn(t, a, deployPool(0))
	learnOn(t, b, deployPool(0)) // b joins the queue: it runs on the pool too
	for i := 1; i <= deploys; i++ {
		cfg.Upstreams = deployPool(i)
		require.NoError(t, a.Reconfigure(cfg))
		learnOn(t, a, deployPool(i))
		if i == 1 {
			// b still runs the old pool: a's heartbeats (every Lease/3)
			// must leave its upstreams' shares alone.
			time.Sleep(2500 * time.Millisecond)
			snap, err := b.Inspect(bg, 0, 0)
			require.NoError(t, err)
			for _, dial := range dialsOf(deployPool(0)) {
				i := slices.IndexFunc(snap.Upstreams, func(u fairqueue.UpstreamInfo) bool { return u.Dial == dial })
				if assert.GreaterOrEqual(t, i, 0, "%s is in b's pool: its learned share must stay", dial) {
					assert.Less(t, snap.Upstreams[i].LearnedShare, 1.0, "%s is in b's pool: its learned share must stay", dial)
				}
			}
		}
		require.NoError(t, b.Reconfigure(cfg))
	}
	return []*fairqueue.Queue{a, b}, dialsOf(deployPool(deploys))
}

// After ten deploys, the store lists learned shares of the upstreams in
// force only (Inspect, and the shares a node is told), not of every dial
// the queue ever had.
func learnedForget(t *testing.T, h Harness) {
	nodes, inForce := RedeployPool(t, h, "learnedforget", 10)
	var listed []string
	eventually(t, 15*time.Second, func() bool {
		snap, err := nodes[0].Inspect(bg, 0, 0)
		require.NoError(t, err)
		listed = listed[:0]
		for _, u := range snap.Upstreams {
			if u.LearnedShare != 0 {
				listed = append(listed, u.Dial)
			}
		}
		// None but those in force: fewer may be listed meanwhile beside
		// an old one still to be forgotten.
		return !slices.ContainsFunc(listed, func(d string) bool { return !slices.Contains(inForce, d) })
	}, "learned shares still listed after the upstreams left every pool: %v (in force: %v)", &listed, inForce)
	for _, dial := range listed {
		assert.Contains(t, inForce, dial)
	}
	var told map[string]float64
	eventually(t, 15*time.Second, func() bool {
		nodes[0].ObserveTTFT(inForce[0], time.Millisecond) // a report: the store answers with its shares
		time.Sleep(150 * time.Millisecond)
		told = nodes[0].Shares()
		for dial := range told {
			if !slices.Contains(inForce, dial) {
				return false
			}
		}
		return true
	}, "a node is still told the shares of upstreams no node has: %v", &told)
}

// A node that reloads to a new pool names it to the store at once: what
// it learns on its new upstreams stays, though another node (still on
// the old pool) beats many times before this node's next regular
// heartbeat (a third of its 30 s lease).
func learnedAfterReload(t *testing.T, h Harness) {
	const name = "learnedafterreload"
	cfg := fairqueue.Config{Upstreams: deployPool(0), MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Lease:    30 * time.Second,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	a := h.NewNode(t, name, cfg)
	fast := cfg
	fast.Lease = time.Second // b beats every third of a second
	b := h.NewNode(t, name, fast)
	learnOn(t, a, deployPool(0))
	learnOn(t, b, deployPool(0))
	time.Sleep(time.Second) // a's first heartbeats are behind it
	cfg.Upstreams = deployPool(1)
	require.NoError(t, a.Reconfigure(cfg))
	learnOn(t, a, deployPool(1))
	time.Sleep(2 * time.Second) // b beats several times
	snap, err := b.Inspect(bg, 0, 0)
	require.NoError(t, err)
	for _, dial := range dialsOf(deployPool(1)) {
		i := slices.IndexFunc(snap.Upstreams, func(u fairqueue.UpstreamInfo) bool { return u.Dial == dial })
		if assert.GreaterOrEqual(t, i, 0, "%s is in a's pool since its reload: its learned share must stay", dial) {
			assert.Less(t, snap.Upstreams[i].LearnedShare, 1.0, "%s is in a's pool since its reload", dial)
		}
	}
}
