package caddyfairqueue

import "testing"

// keepLongestAbortGrace restores, when t ends, the longest abort grace
// of the process (longestAbortGrace) as it was before t: it only grows as
// handlers are provisioned, and the exit waits that long for a request
// that does not end when cut (engine.endRunning), so a test that
// provisions a long abort_grace would otherwise lengthen every later
// test's exit.
func keepLongestAbortGrace(t *testing.T) {
	t.Helper()
	saved := longestAbortGrace.Load()
	t.Cleanup(func() { longestAbortGrace.Store(saved) })
}
