package storetest

import (
	"time"

	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The second node of the differential test (differential.go): n2 shares
// the queue with n1 on each store through a handle of its own. It
// acquires (its waiters are granted by n1's calls too, and told by the
// store's notification), heartbeats, and its config may name no pool
// where n1's names one (a rolling change that adds a pool): a waiter of
// n2 that n1's dispatch grants is then granted on no upstream, and
// counts on every one. A release that finds the releasing node alone
// with its waiters at the head, under a learned capacity, holds another
// node's lowering of the queue share back for fairqueue.HeadsTTL
// (adapt): the Redis store's reply names those heads.

// diffNode2 is what the test knows of n2.
type diffNode2 struct {
	noPool bool // its config names no pool (its last heartbeat named none)
}

// n2Limits is the settings n2's calls carry: n1's in force, without the
// pool where its config names none.
func (d *diff) n2Limits() fairqueue.Limits {
	l := d.lim
	if d.n2.noPool {
		l.Upstreams = nil
		l = withBound(l)
	}
	return l
}

// acquire2 acquires a ticket of n2's.
func (d *diff) acquire2(rt *rapid.T) {
	d.acquireAs(rt, "n2", func(*dTicket) fairqueue.Limits { return d.n2Limits() })
}

// heartbeat2 sends n2's heartbeat, naming its pool or, where rapid draws
// so, none.
func (d *diff) heartbeat2(rt *rapid.T) {
	if len(d.lim.Upstreams) > 0 {
		d.n2.noPool = rapid.Bool().Draw(rt, "n2NoPool")
	}
	d.beat++
	hb := fairqueue.HeartbeatArgs{Node: "n2", Limits: d.n2Limits(), Beat: d.beat, Upstreams: map[string]string{}, Tokens: map[string]int{}}
	d.heartbeatAs(rt, hb)
}

// noteJoin notes when node's call may make it join the queue (its first
// acquire, requeue or heartbeat: leases outlast a check).
func (d *diff) noteJoin(node string) {
	if d.joined == nil {
		d.joined = map[string]bool{}
	}
	if !d.joined[node] {
		d.joined[node] = true
		d.holdAt = time.Now()
	}
}

// noteRelease notes when a release may hold a lowering back (it may
// name heads).
func (d *diff) noteRelease() {
	if d.lim.Learned {
		d.holdAt = time.Now()
	}
}

// adaptNode draws the node that reports to adapt: n1, n2, or one not in
// the queue. A report near fairqueue.HeadsTTL after the last release
// that may have named heads (or join) is not made: the stores read
// their own clocks, and one may see the hold over while the other does
// not.
func (d *diff) adaptNode(rt *rapid.T) string {
	if since := time.Since(d.holdAt); !d.holdAt.IsZero() && since > fairqueue.HeadsTTL/2 && since < 2*fairqueue.HeadsTTL {
		rt.Skip("near the end of a hold")
	}
	return rapid.SampledFrom([]string{"n1", "n1", "n2", "n3"}).Draw(rt, "adaptNode")
}
