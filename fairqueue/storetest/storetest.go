// Package storetest is the conformance suite every fairqueue.Store must
// pass: one table of behaviours, run against the Redis store and the
// in-process store alike, so the two cannot drift apart.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Harness gives the suite what it needs of one Store implementation.
type Harness struct {
	// NewNode opens queue name as a new node (its own Queue, as one
	// process would have); nodes of one name in one test share permits.
	// The harness closes it when the test ends.
	NewNode func(t *testing.T, name string, cfg fairqueue.Config) *fairqueue.Queue
	// State returns the queue's waiting and holding tickets as the store
	// has them.
	State func(t *testing.T, name string) (waiting, holders []string)
	// Store returns a new handle on queue name, as one process opens it,
	// for the cases that drive the Store contract directly; the case
	// opens it as a node and closes it. Optional: without it those cases
	// are skipped.
	Store func(t *testing.T, name string) fairqueue.Store
}

// Run runs every behaviour of the suite as a subtest.
func Run(t *testing.T, h Harness) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, h) })
	}
}

type testCase struct {
	name string
	run  func(t *testing.T, h Harness)
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// GrantNo returns p's grant number (Permit.GrantNo) once the node knows
// it. A grant can reach its waiter before its number does: reconcile
// finds a grant whose message is late (from Redis or, for the in-process
// store, from the call that made it), and a local handoff starts its
// waiter before the transfer's reply comes, as does a grant made by
// another node meanwhile. The number arrives with that message or reply,
// and only while the permit is held: a released ticket is forgotten and
// its late message finds nobody. So call it before Release. It reports
// an error on t (from any goroutine) and returns 0 when the number is not
// known within 10 s.
func GrantNo(t testing.TB, p *fairqueue.Permit) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if no := p.GrantNo(); no != 0 {
			return no
		}
		if time.Now().After(deadline) {
			t.Errorf("grant number of %s not known 10 s after its grant", p.Ticket())
			return 0
		}
		time.Sleep(time.Millisecond)
	}
}

var bg = context.Background()
