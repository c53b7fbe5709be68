package llm

import (
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLLMPlansAreTheSameForEverySystem(t *testing.T) {
	t.Parallel()
	set := report.DefaultLLMSettings(false)
	seeds := map[uint64]float64{}
	for _, load := range set.Loads {
		seed := set.LevelSeed(load)
		_, dup := seeds[seed]
		assert.False(t, dup, "a seed of its own per load")
		seeds[seed] = load
		a, b := set.Plan(load), set.Plan(load)
		require.NotEmpty(t, a.Arrivals)
		assert.Equal(t, a, b, "load %.2f: drawn again, the same sequence", load)
		// The rate is load x permits / the sample mean.
		assert.InDelta(t, load*float64(set.Permits)/a.MeanService.Seconds(), a.Rate, 0.03*a.Rate)
		assert.InDelta(t, load*float64(set.Permits)*set.ArrivalsS, a.Work.Seconds(), 0.03*a.Work.Seconds(), "the load's work")
		for _, arr := range a.Arrivals {
			require.Equal(t, 20*time.Millisecond, arr.Delay)
			require.GreaterOrEqual(t, arr.Tokens, 1)
			require.LessOrEqual(t, arr.Tokens, int(set.MaxServiceMS/set.TokenMS))
			require.GreaterOrEqual(t, arr.PromptBytes, set.MinPromptBytes)
			require.LessOrEqual(t, arr.PromptBytes, set.MaxPromptBytes)
		}
	}
	assert.Equal(t, set.LevelSeed(1.0), report.DefaultLLMSettings(true).LevelSeed(1.0), "quick and full draw load 1.0 from one seed")
}

func TestLLMSpecs(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range llmSpecs() {
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{"haproxy", "fq-local", "fq-redis-1", "fq-redis-3"}, names)
}
