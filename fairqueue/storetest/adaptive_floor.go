package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases, testCase{"LearnedShareIsNeverBelowAFloorRaisedByAReload", learnedFloorRaised})
}

// The learned share never goes below floor (docs/adaptive.md). A reload
// that raises floor above the share learned so far must raise the
// capacity in force to it with the next report, not only once a window
// has enough samples to judge the target (min_samples: at the default
// 100, a hundred more answers at the old, lower capacity; never, for a
// queue whose clients never stream).
func learnedFloorRaised(t *testing.T, h Harness) {
	const name = "learnedfloor"
	cfg := fairqueue.Config{Permits: 8, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.25,
			Floor: 0.125, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	p, err := q.Acquire(bg, fairqueue.Request{}) // joins the queue
	require.NoError(t, err)
	p.Release()
	q.ObserveTTFT("", time.Second)
	eventually(t, 10*time.Second, func() bool { return q.Share() < 1 }, "the share did not move")
	require.Equal(t, 0.25, q.Share(), "one breach: a quarter, 2 of 8 permits")

	cfg.Adaptive.Floor, cfg.Adaptive.MinSamples = 0.5, 100 // at least 4 permits now
	require.NoError(t, q.Reconfigure(cfg))
	deadline := time.Now().Add(3 * time.Second)
	for q.Share() < 0.5 && time.Now().Before(deadline) {
		q.ObserveTTFT("", time.Millisecond) // answers under the target: a window far from ripe
		time.Sleep(150 * time.Millisecond)
	}
	assert.Equal(t, 0.5, q.Share(), "the share in force, under a floor of 0.5")
	var held []*fairqueue.Permit
	for range 4 {
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		p, err := q.Acquire(ctx, fairqueue.Request{})
		cancel()
		if err != nil {
			break
		}
		held = append(held, p)
	}
	assert.Len(t, held, 4, "floor 0.5 of 8 permits: 4 run at once")
	for _, p := range held {
		p.Release()
	}
}
