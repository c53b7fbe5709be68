package capacity

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

func TestCapacityPlanIsTheSameSequenceForEverySystemAndAboveCapacity(t *testing.T) {
	set := report.DefaultCapacitySettings(true)
	top := set.Topologies[0]
	a, rate, ideal := capacityPlan(set, top, 0)
	b, _, _ := capacityPlan(set, top, 0)
	require.Equal(t, a, b)
	require.NotEmpty(t, a)
	long := 0
	answers := 0
	for _, q := range a {
		assert.LessOrEqual(t, q.At, report.Secs(set.ArrivalsS))
		if q.Long {
			long++
			assert.GreaterOrEqual(t, q.Prompt, 8000)
		} else {
			assert.LessOrEqual(t, q.Prompt, 1000)
		}
		answers += q.Answer
	}
	assert.Positive(t, long, "the mixed workload has long prompts")
	// Arrivals ask for more than the backend can make.
	assert.Greater(t, float64(answers)/set.ArrivalsS, ideal.CapacityTPS)
	assert.Positive(t, rate)
	// The pool draws the same sizes, at its own rate.
	c, poolRate, _ := capacityPlan(set, set.Topologies[1], 0)
	assert.Greater(t, poolRate, rate)
	assert.Equal(t, a[0].Prompt, c[0].Prompt)
}

func TestIdealCapacityFollowsTheCacheAndTheMix(t *testing.T) {
	r := report.GPUReplica{KVTokens: 10_000, MaxNumSeqs: 64, MaxBatchedTokens: 1000, StepBaseMS: 10, StepPerSeqMS: 1, PrefillPerTokUS: 10}
	top := report.CapacityTopology{Replicas: []report.GPUReplica{r}}
	// 900 + 200/2 = 1000 tokens a sequence: 10 fit.
	id := idealCapacity(top, []capRequest{{Prompt: 900, Answer: 200}})
	assert.Equal(t, []float64{10}, id.Batch)
	// A token costs 10/10 + 1 = 2 ms; the prompt 9 ms: 200 / 0.409 s.
	assert.InDelta(t, 200/0.409, id.CapacityTPS, 0.1)
	// One chunk of the prompt in a step of 10 + 10 x 1 ms, plus 899 x 10 us.
	assert.InDelta(t, 28.99, id.TTFTP99MS, 0.1)
	// Small sequences: max_num_seqs bounds the batch.
	assert.Equal(t, []float64{64}, idealCapacity(top, []capRequest{{Prompt: 10, Answer: 10}}).Batch)
	// Two replicas add up.
	two := idealCapacity(report.CapacityTopology{Replicas: []report.GPUReplica{r, r}}, []capRequest{{Prompt: 900, Answer: 200}})
	assert.InDelta(t, 2*id.CapacityTPS, two.CapacityTPS, 0.2)
}

func TestSummarizeCapacity(t *testing.T) {
	set := report.CapacitySettings{SLOTTFTMS: 100, SLOTPOTMS: 10}
	ms := func(v float64) time.Duration { return report.MS(v) }
	run := &report.CapacityRun{}
	summarizeCapacity(run, []capResult{
		{Start: 0, FirstToken: ms(50), End: ms(140), Tokens: 10, Done: true, Status: 200},        // meets the SLO
		{Start: ms(100), FirstToken: ms(300), End: ms(400), Tokens: 11, Done: true, Status: 200}, // TTFT 200 ms
		{Start: ms(200), FirstToken: ms(250), End: ms(1000), Tokens: 5, Cut: true},               // cut
		{Start: ms(300), End: ms(310), Status: 429, Rejected: true},
	}, set)
	assert.Equal(t, 4, run.Sent)
	assert.Equal(t, 2, run.Finished)
	assert.Equal(t, 1, run.Cut)
	assert.Equal(t, 1, run.Rejected)
	assert.Equal(t, 1.0, run.ElapsedS)
	assert.Equal(t, 21.0, run.GoodputTPS, "the finished requests' tokens only")
	assert.Equal(t, 0.25, run.SLOShare)
	assert.Equal(t, 200.0, run.TTFTP99MS)
}

func TestSweepEndsPicksTheMostAndTheLeastGoodput(t *testing.T) {
	runs := []*report.CapacityRun{
		{Row: report.CapacityRow{Name: "alone", Kind: report.KindAlone}, GoodputTPS: 999},
		{Row: report.CapacityRow{Name: "fq-4", Kind: systems.KindFairQueue, Permits: 4}, GoodputTPS: 100},
		{Row: report.CapacityRow{Name: "fq-16", Kind: systems.KindFairQueue, Permits: 16}, GoodputTPS: 300},
		{Row: report.CapacityRow{Name: "fq-32", Kind: systems.KindFairQueue, Permits: 32}, GoodputTPS: 300},
		{Row: report.CapacityRow{Name: "fq-64", Kind: systems.KindFairQueue, Permits: 64}, GoodputTPS: 50},
		{Row: report.CapacityRow{Name: "fq-kv", Kind: systems.KindFairQueue, Permits: 64, KVTokens: true}, GoodputTPS: 900},
	}
	best, worst := sweepEnds(runs)
	assert.Equal(t, 16, best, "a tie goes to fewer permits; the kv_tokens row is not of the sweep")
	assert.Equal(t, 64, worst)
}

// TestCapacityRunAgainstTheGPUModel sends a small sequence to a real
// mockllm GPU model, in-process, fast, and reads its figures as the
// scenario does.
func TestCapacityRunAgainstTheGPUModel(t *testing.T) {
	mock := mockllm.New(mockllm.Config{GPU: mockllm.GPUConfig{KVTokens: 1500, MaxNumSeqs: 8,
		StepBase: time.Millisecond, StepPerSeq: 10 * time.Microsecond, PrefillPerToken: time.Microsecond}})
	hs := httptest.NewServer(mock.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(mock.Close)
	// 2 prompts of 700 tokens fill 1400 of 1500 tokens: their answers
	// overflow the cache after 50 steps, long before either ends.
	var seq []capRequest
	for i := range 8 {
		seq = append(seq, capRequest{Prompt: 700, Answer: 300 + i})
	}
	results := sendCapacity(context.Background(), []string{hs.URL}, seq, time.Now(), false)
	run := &report.CapacityRun{}
	summarizeCapacity(run, results, report.CapacitySettings{SLOTTFTMS: 60_000, SLOTPOTMS: 60_000})
	assert.Equal(t, 8, run.Finished)
	for i, r := range results {
		assert.Equal(t, seq[i].Answer, r.Tokens, "request %d", i)
	}
	st := mock.Stats().GPU
	assert.LessOrEqual(t, st.MaxKVUsed, 1500)
	assert.Positive(t, st.Preemptions)
	assert.Equal(t, 1.0, run.SLOShare)

	// Without max_tokens, the header says each answer's length.
	results = sendCapacity(context.Background(), []string{hs.URL}, seq[:3], time.Now(), true)
	for i, r := range results {
		assert.True(t, r.Done, "request %d", i)
		assert.Equal(t, seq[i].Answer, r.Tokens, "request %d: the usage chunk is not a token", i)
	}
}

func TestRowsWithoutMaxTokensSendTheLengthInTheHeaderAndAskForTheUsage(t *testing.T) {
	q := capRequest{Prompt: 3, Answer: 42}
	var exact, open map[string]any
	require.NoError(t, json.Unmarshal(capBody(q, "abcdefghijkl", false), &exact))
	assert.Equal(t, 42.0, exact["max_tokens"])
	assert.NotContains(t, exact, "stream_options")
	require.NoError(t, json.Unmarshal(capBody(q, "abcdefghijkl", true), &open))
	assert.NotContains(t, open, "max_tokens")
	assert.Equal(t, map[string]any{"include_usage": true}, open["stream_options"])
	assert.Equal(t, exact["messages"], open["messages"], "the same prompt")

	got := make(chan http.Header, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(hs.Close)
	sendCapacity(context.Background(), []string{hs.URL}, []capRequest{q}, time.Now(), true)
	assert.Equal(t, "42", (<-got).Get(mockllm.HeaderTokens))
	sendCapacity(context.Background(), []string{hs.URL}, []capRequest{q}, time.Now(), false)
	assert.Empty(t, (<-got).Get(mockllm.HeaderTokens), "max_tokens says it")
}

func TestLearnedBudgetRowsAreSelectableAndLikeTheKVRow(t *testing.T) {
	full := report.DefaultCapacitySettings(false)
	s := onlyCases(full, []string{"one", "fq-kv", "fq-kv-learned", "fq-kv-1024"})
	require.Len(t, s.Rows, 3)
	kv, learned, fixed := s.Rows[0], s.Rows[1], s.Rows[2]
	assert.Equal(t, []string{"fq-kv", "fq-kv-learned", "fq-kv-1024"}, []string{kv.Name, learned.Name, fixed.Name})
	assert.False(t, kv.NoMaxTokens, "fq-kv sends the exact budget")
	for _, r := range []report.CapacityRow{learned, fixed} {
		assert.True(t, r.NoMaxTokens, r.Name)
		assert.True(t, r.KVTokens, r.Name)
		assert.Equal(t, kv.Permits, r.Permits, r.Name)
	}
	assert.Zero(t, learned.DefaultMaxTokens, "learned: default_max_tokens unset")
	assert.Equal(t, 1024, fixed.DefaultMaxTokens)
	quick := report.DefaultCapacitySettings(true)
	assert.False(t, slices.ContainsFunc(quick.Rows, func(r report.CapacityRow) bool { return r.NoMaxTokens }), "not in a quick run")
}

func TestCapacitySettingsOnlyPicksNamedCasesFromAFullRun(t *testing.T) {
	quick := report.DefaultCapacitySettings(true)
	s := onlyCases(quick, []string{"one", "chat"})
	require.Len(t, s.Topologies, 1)
	assert.Equal(t, "one", s.Topologies[0].Name)
	require.Len(t, s.Workloads, 1)
	assert.Equal(t, "chat", s.Workloads[0].Name)
	assert.Equal(t, quick.Rows, s.Rows, "the mode's rows")
	assert.Equal(t, quick, onlyCases(quick, nil))
	assert.Len(t, onlyCases(quick, []string{"pool"}).Workloads, 1, "the quick run's workloads")
	rows := onlyCases(quick, []string{"fq-kv", "fq-adaptive"})
	assert.Equal(t, []string{"fq-kv", "fq-adaptive"}, []string{rows.Rows[0].Name, rows.Rows[1].Name})
	assert.Len(t, rows.Rows, 2)
	assert.Equal(t, "fq-kv", rows.PoolRows[0].Name, "the pool's rows named; fq-adaptive is not one of a quick run's")
}
