package loadgen

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseReplicas(t *testing.T) {
	t.Parallel()
	const a, b, c = "http://127.0.0.1:1/stats", "http://127.0.0.1:2/stats", "http://127.0.0.1:3/stats"
	for _, tc := range []struct {
		name, stats, permits string
		want                 []Replica
		wantErr              string
	}{
		{name: "nothing to watch", stats: "", permits: "", want: nil},
		{name: "permits without stats are ignored", stats: "", permits: "4", want: nil},
		{name: "one upstream, one count (the old form)", stats: a, permits: "4", want: []Replica{{a, 4}}},
		{name: "one upstream, unchecked", stats: a, permits: "", want: []Replica{{a, 0}}},
		{name: "one upstream, zero is unchecked", stats: a, permits: "0", want: []Replica{{a, 0}}},
		{name: "three replicas", stats: a + "," + b + "," + c, permits: "1,2,3", want: []Replica{{a, 1}, {b, 2}, {c, 3}}},
		{name: "spaces are trimmed", stats: a + " , " + b, permits: " 1 , 2 ", want: []Replica{{a, 1}, {b, 2}}},
		{name: "three replicas, unchecked", stats: a + "," + b + "," + c, permits: "", want: []Replica{{a, 0}, {b, 0}, {c, 0}}},
		{name: "one count for three replicas", stats: a + "," + b + "," + c, permits: "6", wantErr: "1 values for 3"},
		{name: "too many counts", stats: a, permits: "1,2", wantErr: "2 values for 1"},
		{name: "empty URL", stats: a + ",," + c, permits: "1,2,3", wantErr: "empty URL at position 2"},
		{name: "not a number", stats: a + "," + b, permits: "1,x", wantErr: `"x" is not a count`},
		{name: "negative", stats: a + "," + b, permits: "1,-2", wantErr: `"-2" is not a count`},
		{name: "empty count", stats: a + "," + b, permits: "1,", wantErr: `"" is not a count`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseReplicas(tc.stats, tc.permits)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestReplicaSummaryFlagsEachReplicaOverItsPermits(t *testing.T) {
	t.Parallel()
	three := []Replica{
		{"http://127.0.0.1:1/stats", 1}, {"http://127.0.0.1:2/stats", 2}, {"http://127.0.0.1:3/stats", 3},
	}
	maxes := func(ns ...int) []UpstreamStats {
		st := make([]UpstreamStats, len(ns))
		for i, n := range ns {
			st[i].MaxInFlight = n
		}
		return st
	}
	for _, tc := range []struct {
		name     string
		replicas []Replica
		stats    []UpstreamStats
		over     bool
		lines    []string
	}{
		{name: "each at its permits", replicas: three, stats: maxes(1, 2, 3), lines: []string{
			"replica 1 127.0.0.1:1  max concurrency 1 vs permits 1: OK, never above the permits",
			"replica 2 127.0.0.1:2  max concurrency 2 vs permits 2: OK, never above the permits",
			"replica 3 127.0.0.1:3  max concurrency 3 vs permits 3: OK, never above the permits",
		}},
		{name: "below is fine", replicas: three, stats: maxes(0, 1, 3)},
		// The sum (6) is within the pool's permits, but the first replica
		// ran two requests with one permit: a per-replica check fails.
		{name: "one replica over, sum within", replicas: three, stats: maxes(2, 2, 2), over: true, lines: []string{
			"replica 1 127.0.0.1:1  max concurrency 2 vs permits 1: OVER THE LIMIT",
		}},
		{name: "last replica over", replicas: three, stats: maxes(1, 2, 4), over: true},
		{name: "unchecked replica never over", replicas: []Replica{{"http://h:1/stats", 0}, {"http://h:2/stats", 2}},
			stats: maxes(9, 2), lines: []string{"replica 1 h:1  max concurrency 9\n"}},
		{name: "one upstream: the old line", replicas: three[2:], stats: maxes(3), lines: []string{
			"upstream: max concurrency 3 vs permits 3: OK, never above the permits\n",
		}},
		{name: "one upstream over", replicas: []Replica{{"http://h:1/stats", 4}}, stats: maxes(5), over: true, lines: []string{
			"upstream: max concurrency 5 vs permits 4: OVER THE LIMIT\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			over := WriteReplicaSummary(&out, tc.replicas, tc.stats)
			assert.Equal(t, tc.over, over)
			assert.Equal(t, tc.over, AnyOver(tc.replicas, tc.stats))
			assert.Equal(t, len(tc.replicas), strings.Count(out.String(), "\n"), "a line per replica:\n%s", out.String())
			for _, l := range tc.lines {
				assert.Contains(t, out.String(), l)
			}
		})
	}
}

func TestReplicaLine(t *testing.T) {
	t.Parallel()
	reps := []Replica{{"a", 1}, {"b", 2}, {"c", 0}}
	st := []UpstreamStats{{InFlight: 1, MaxInFlight: 1}, {InFlight: 0, MaxInFlight: 2}, {InFlight: 5, MaxInFlight: 7}}
	assert.Equal(t, "replicas 1/1 0/2 5 (max 1 2 7)", replicaLine(reps, st, make([]error, 3)))
	assert.Equal(t, "replicas 1/1 ?/2 5 (max 1 ? 7)", replicaLine(reps, st, []error{nil, assert.AnError, nil}))
}

// Two mock replicas behind a round-robin load: the progress line and
// what the monitor saw show each one's own concurrency.
func TestProgressShowsEachReplica(t *testing.T) {
	t.Parallel()
	_, u1 := startMock(t)
	_, u2 := startMock(t)
	// One round of four clients over two targets: two at once on each.
	r, err := New(Config{Targets: []string{u1, u2}, Clients: 4, Requests: 4, Tokens: 1, Delay: 100 * time.Millisecond})
	require.NoError(t, err)
	reps, err := ParseReplicas(u1+"/stats,"+u2+"/stats", "2,3")
	require.NoError(t, err)
	var out bytes.Buffer
	mon := StartProgress(r, &out, ProgressConfig{Every: 20 * time.Millisecond, Replicas: reps})
	_, err = r.Run(context.Background())
	require.NoError(t, err)
	obs := mon.Stop()

	require.Len(t, obs.Replicas, 2)
	assert.Equal(t, 2, obs.Replicas[0].MaxInFlight)
	assert.Equal(t, 2, obs.Replicas[1].MaxInFlight)
	assert.Equal(t, 4, obs.Replicas[0].Served+obs.Replicas[1].Served)
	assert.Contains(t, out.String(), "| replicas 2/2 2/3 (max 2 2)")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	assert.Contains(t, lines[len(lines)-1], "| replicas 0/2 0/3 (max 2 2)")
	assert.False(t, AnyOver(reps, obs.Replicas))
	reps[1].Permits = 1
	assert.True(t, AnyOver(reps, obs.Replicas), "the second replica ran 2 with 1 permit")
}
