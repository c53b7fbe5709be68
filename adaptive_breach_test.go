package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reference gave breach_share the range [0, 1), and the Caddyfile
// took `breach_share 0`; but 0 is the field's unset value, and the queue
// ran with the default, 0.01: a window in which one TTFT of a hundred
// was above the target was no breach. A value the Caddyfile takes must be
// the one in force, or be refused naming the option.
func TestAdaptiveBreachShareZeroIsInForceOrRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h, err := parse("fair_queue {\nname breach-zero\npermits 16\nadaptive {\ntarget_ttft 1s\ninterval 100ms\nmin_samples 100\nbreach_share 0\n}\n}")
	if err != nil {
		assert.Contains(t, err.Error(), "breach_share")
		assert.Contains(t, err.Error(), "Testfile:8", "the error names the option's line")
		return
	}
	provisionLocal(t, newContext(t), h)
	require.NoError(t, newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).err, "the node joins the queue")
	q := engineOf(t, h).q
	q.ObserveTTFT("", 2*time.Second) // above the target
	for range 99 {
		q.ObserveTTFT("", time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond) // the interval: the next sample sends the window
	q.ObserveTTFT("", time.Millisecond)
	require.Eventually(t, func() bool { _, ok := q.Shares()[""]; return ok }, 5*time.Second, 10*time.Millisecond,
		"a ripe window of 101 samples moves the share")
	assert.Less(t, q.Shares()[""], 1.0, "breach_share 0: one TTFT above the target of 101 is a breach; share %v", q.Shares()[""])
}
