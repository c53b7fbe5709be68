package bench

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

func TestCapacityPlanIsTheSameSequenceForEverySystemAndAboveCapacity(t *testing.T) {
	set := capacitySettings(true)
	top := set.Topologies[0]
	a, rate, ideal := capacityPlan(set, top, 0)
	b, _, _ := capacityPlan(set, top, 0)
	require.Equal(t, a, b)
	require.NotEmpty(t, a)
	long := 0
	answers := 0
	for _, q := range a {
		assert.LessOrEqual(t, q.At, secs(set.ArrivalsS))
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
	r := GPUReplica{KVTokens: 10_000, MaxNumSeqs: 64, MaxBatchedTokens: 1000, StepBaseMS: 10, StepPerSeqMS: 1, PrefillPerTokUS: 10}
	top := CapacityTopology{Replicas: []GPUReplica{r}}
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
	two := idealCapacity(CapacityTopology{Replicas: []GPUReplica{r, r}}, []capRequest{{Prompt: 900, Answer: 200}})
	assert.InDelta(t, 2*id.CapacityTPS, two.CapacityTPS, 0.2)
}

func TestSummarizeCapacity(t *testing.T) {
	set := CapacitySettings{SLOTTFTMS: 100, SLOTPOTMS: 10}
	ms := func(v float64) time.Duration { return ms2d(v) }
	run := &CapacityRun{}
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
	runs := []*CapacityRun{
		{Row: alone(), GoodputTPS: 999},
		{Row: fqRows(4)[0], GoodputTPS: 100},
		{Row: fqRows(16)[0], GoodputTPS: 300},
		{Row: fqRows(32)[0], GoodputTPS: 300},
		{Row: fqRows(64)[0], GoodputTPS: 50},
	}
	best, worst := sweepEnds(runs)
	assert.Equal(t, 16, best, "a tie goes to fewer permits")
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
	results := sendCapacity(context.Background(), []string{hs.URL}, seq, time.Now())
	run := &CapacityRun{}
	summarizeCapacity(run, results, CapacitySettings{SLOTTFTMS: 60_000, SLOTPOTMS: 60_000})
	assert.Equal(t, 8, run.Finished)
	for i, r := range results {
		assert.Equal(t, seq[i].Answer, r.Tokens, "request %d", i)
	}
	st := mock.Stats().GPU
	assert.LessOrEqual(t, st.MaxKVUsed, 1500)
	assert.Positive(t, st.Preemptions)
	assert.Equal(t, 1.0, run.SLOShare)
}

func TestCapacityReportAndPlots(t *testing.T) {
	set := capacitySettings(true)
	seq, rate, ideal := capacityPlan(set, set.Topologies[0], 0)
	cs := &CapacityCase{Topology: "one", Workload: "mixed", Requests: len(seq), RateRPS: rate, Ideal: ideal}
	for i, row := range set.Rows {
		cs.Runs = append(cs.Runs, &CapacityRun{Row: row, GoodputTPS: float64(100 + i), VsIdeal: 0.5, MaxKVUsed: []int{48_000},
			Samples: []CapacitySample{{AtS: 0}, {AtS: 1, KVUsed: 100, Running: 3, Waiting: 2}}})
	}
	cs.BestPermits, cs.WorstPermits = sweepEnds(cs.Runs)
	c := &Capacity{Settings: set, Cases: []*CapacityCase{cs}}
	dir := t.TempDir()
	files, err := writeCapacityPlots(c, dir)
	require.NoError(t, err)
	require.Equal(t, []string{"capacity-one-mixed.png"}, files)
	_, err = os.Stat(filepath.Join(dir, files[0]))
	require.NoError(t, err)
	var b strings.Builder
	capacityMarkdown(&b, c, map[string]string{files[0]: "x/" + files[0]})
	md := b.String()
	assert.Contains(t, md, "Best fixed permits: **32** per replica; worst: 8.")
	assert.Contains(t, md, "![KV tokens")
	assert.Equal(t, verdict(true), capacityChecks(c)[0].Result)
}

func TestCapacitySettingsOnlyPicksNamedCasesFromAFullRun(t *testing.T) {
	quick := capacitySettings(true)
	s := quick.only([]string{"one", "chat"})
	require.Len(t, s.Topologies, 1)
	assert.Equal(t, "one", s.Topologies[0].Name)
	require.Len(t, s.Workloads, 1)
	assert.Equal(t, "chat", s.Workloads[0].Name)
	assert.Equal(t, quick.Rows, s.Rows, "the mode's rows")
	assert.Equal(t, quick, quick.only(nil))
	assert.Len(t, quick.only([]string{"pool"}).Workloads, 1, "the quick run's workloads")
}
