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

var bg = context.Background()
