package fairqueue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestNextShareIsAIMDOnTheTargetBetweenFloorAndOne(t *testing.T) {
	a := AdaptArgs{Floor: 0.1, Decrease: 0.9, Step: 0.05, BreachShare: 0.01}
	assert.InDelta(t, 0.9, NextShare(1, 100, 2, 0, 0, true, a), 1e-12, "2% above the target: a breach")
	assert.Equal(t, 1.0, NextShare(1, 100, 1, 0, 0, true, a), "1% is allowed; at the ceiling already")
	assert.InDelta(t, 0.55, NextShare(0.5, 100, 1, 0, 0, true, a), 1e-12, "under the target and limited: a step up")
	assert.Equal(t, 0.5, NextShare(0.5, 100, 0, 0, 0, false, a), "not limited: it stays")
	assert.Equal(t, 0.5, NextShare(0.5, 0, 0, 0, 0, true, a), "nothing measured: it stays")
	assert.InDelta(t, 0.45, NextShare(0.5, 0, 0, 1, 0, true, a), 1e-12, "a refusal (429/503) cuts")
	assert.Equal(t, 0.1, NextShare(0.105, 10, 10, 0, 0, true, a), "never below the floor")
	assert.InDelta(t, 0.55, NextShare(0.5, 0, 0, 0, 100, true, a), 1e-12, "plain answers, none refused, limited: a step up")
	assert.Equal(t, 0.5, NextShare(0.5, 0, 0, 0, 100, false, a), "plain answers, not limited: it stays")
	assert.InDelta(t, 0.45, NextShare(0.5, 0, 0, 1, 100, true, a), 1e-12, "a refusal among plain answers cuts")
	assert.InDelta(t, 0.45, NextShare(0.5, 100, 2, 0, 1000, true, a), 1e-12, "plain answers dilute no breach")
}

func TestAWindowIsRipeWithARefusalOrEnoughSamples(t *testing.T) {
	a := Adaptive{TargetTTFT: time.Second}.withDefaults()
	assert.Equal(t, 100, a.MinSamples, "a p99 needs 100 samples")
	assert.Equal(t, 20, Adaptive{TargetTTFT: time.Second, BreachShare: 0.05}.withDefaults().MinSamples)
	assert.Equal(t, 10, Adaptive{TargetTTFT: time.Second, BreachShare: 0.5}.withDefaults().MinSamples)
	args := AdaptArgs{MinSamples: a.MinSamples}
	assert.False(t, Ripe(99, 0, 0, args))
	assert.True(t, Ripe(100, 0, 0, args))
	assert.True(t, Ripe(0, 1, 0, args), "a refusal moves at once")
	assert.True(t, Ripe(0, 0, 100, args), "a window of plain answers alone")
	assert.False(t, Ripe(0, 0, 99, args))
	assert.False(t, Ripe(1, 0, 1000, args), "a window with a TTFT waits for enough of them")
}

func TestScaleAppliesTheShareToEveryCapacityAtLeastOne(t *testing.T) {
	l := Limits{Permits: 10, Tokens: 1000, Learned: true, Upstreams: []Upstream{{Dial: "a", Permits: 3, KVTokens: 500}, {Dial: "b", Permits: 1}}}
	l.TokenBound = 1000
	s := l.Scale(map[string]float64{"": 0.25, "a": 0.5})
	assert.Equal(t, 10, s.Permits, "with a pool the queue's share does not apply")
	assert.Equal(t, 1000, s.Tokens, "with a pool the queue's share does not apply")
	np := Limits{Permits: 10, Tokens: 1000, Learned: true}.Scale(map[string]float64{"": 0.25})
	assert.Equal(t, 2, np.Permits)
	assert.Equal(t, 250, np.Tokens)
	assert.Equal(t, []Upstream{{Dial: "a", Permits: 1, KVTokens: 250}, {Dial: "b", Permits: 1}}, s.Upstreams, "each upstream its own share; none: all of it")
	assert.Equal(t, 1000, s.TokenBound, "the bound follows the largest share in force: b has none, all of it")
	assert.Equal(t, 500, l.Scale(map[string]float64{"": 0.25, "a": 0.5, "b": 0.25}).TokenBound, "the bound follows the largest upstream share")
	assert.Equal(t, 250, Limits{Tokens: 1000, TokenBound: 1000, Learned: true}.Scale(map[string]float64{"": 0.25, "x": 0.5}).TokenBound, "without a pool, the queue's share; not another key's")
	assert.Equal(t, 3, l.Upstreams[0].Permits, "the caller's limits are not changed")
	l.Learned = false
	assert.Equal(t, l, l.Scale(map[string]float64{"": 0.25}), "without Learned the limits stand")
}

func TestAdaptiveSettingsAreValidated(t *testing.T) {
	for _, c := range []struct {
		a    Adaptive
		want string
	}{
		{Adaptive{}, "target_ttft is required"},
		{Adaptive{TargetTTFT: time.Second, Floor: 2}, "floor must be in (0, 1]"},
		{Adaptive{TargetTTFT: time.Second, Interval: time.Millisecond}, "interval must be at least 100ms"},
		{Adaptive{TargetTTFT: time.Second, Decrease: 1}, "decrease must be in (0, 1)"},
		{Adaptive{TargetTTFT: time.Second, Step: 2}, "step must be in (0, 1]"},
		{Adaptive{TargetTTFT: time.Second, BreachShare: 1}, "breach_share must be in (0, 1)"},
	} {
		err := Config{Permits: 1, Adaptive: &c.a}.Validate()
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), c.want)
		}
	}
	assert.NoError(t, Config{Permits: 1, Adaptive: &Adaptive{TargetTTFT: time.Second}}.Validate())
}
