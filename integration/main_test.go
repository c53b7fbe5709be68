package integration

import (
	"os"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
)

// TestMain gives the Caddy binary that internal/harness builds a
// directory, and removes it afterwards.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// eventually polls cond every 20ms until it holds or d passes, and
// reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
