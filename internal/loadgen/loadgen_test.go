package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func startMock(t *testing.T) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(mockllm.Config{Tokens: 2, Delay: time.Millisecond})
	hs := httptest.NewServer(m.Handler())
	t.Cleanup(hs.Close)
	return m, hs.URL
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	r, err := New(cfg)
	require.NoError(t, err)
	rep, err := r.Run(context.Background())
	require.NoError(t, err)
	return rep
}

func TestClosedLoopSendsExactlyNRequestsRoundRobin(t *testing.T) {
	t.Parallel()
	m1, u1 := startMock(t)
	m2, u2 := startMock(t)
	rep := run(t, Config{Targets: []string{u1, u2}, Clients: 4, Requests: 20, Stream: true, Tokens: 3, Delay: -1})

	assert.Equal(t, 20, rep.Sent)
	assert.Equal(t, 20, rep.OK)
	assert.Equal(t, map[string]int{"200": 20}, rep.ByStatus)
	assert.Equal(t, 10, m1.Served())
	assert.Equal(t, 10, m2.Served())
	require.Len(t, rep.Targets, 2)
	for _, tr := range rep.Targets {
		assert.Equal(t, 10, tr.OK)
		assert.Equal(t, 10, tr.Total.Count)
		assert.LessOrEqual(t, tr.TTFB.P50, tr.Total.P50)
	}
	for _, res := range rep.All() {
		assert.True(t, res.Done, "every stream ends with [DONE]")
		assert.GreaterOrEqual(t, res.Total, 3*time.Millisecond, "3 tokens of 1ms")
	}
	assert.Empty(t, rep.Results, "results are kept only on request")
}

func TestClosedLoopStopsAfterDuration(t *testing.T) {
	t.Parallel()
	_, u := startMock(t)
	start := time.Now()
	rep := run(t, Config{Targets: []string{u}, Clients: 2, Duration: 200 * time.Millisecond, Tokens: 1, Delay: 5 * time.Millisecond})
	assert.Less(t, time.Since(start), time.Second)
	assert.Greater(t, rep.OK, 10)
	assert.Equal(t, rep.Sent, rep.OK)
}

func TestOpenLoopSendsAtTheRateWhateverTheLatency(t *testing.T) {
	t.Parallel()
	m, u := startMock(t)
	// Each answer takes 100ms, so a closed loop would send far fewer.
	rep := run(t, Config{Targets: []string{u}, Rate: 100, Duration: 300 * time.Millisecond, Tokens: 1, Delay: 100 * time.Millisecond})
	assert.Equal(t, 30, rep.Sent)
	assert.Equal(t, 30, rep.OK)
	assert.GreaterOrEqual(t, m.MaxInFlight(), 5, "arrivals do not wait for answers")
}

func TestOpenLoopDropsArrivalsBeyondMaxInFlight(t *testing.T) {
	t.Parallel()
	_, u := startMock(t)
	rep := run(t, Config{Targets: []string{u}, Rate: 200, Duration: 100 * time.Millisecond, MaxInFlight: 2, Tokens: 1, Delay: time.Second})
	assert.Equal(t, 2, rep.Sent)
	assert.Equal(t, int64(18), rep.Dropped)
}

// rejecter answers like a fair_queue reject: JSON with 429, or an SSE
// error event for streaming requests.
func rejecter(t *testing.T) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderReason, "timeout")
		if r.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, "event: error\ndata: {\"error\":{\"message\":\"queue timeout\"}}\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"queue timeout"}}`)
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

func TestRejectsAreCountedByReason(t *testing.T) {
	t.Parallel()
	u := rejecter(t)
	for _, stream := range []bool{false, true} {
		rep := run(t, Config{Targets: []string{u}, Clients: 2, Requests: 6, Stream: stream, Tokens: -1, Delay: -1})
		assert.Equal(t, 6, rep.Rejected, "stream=%v", stream)
		assert.Equal(t, map[string]int{"timeout": 6}, rep.ByReason)
		assert.Equal(t, map[string]int{"429": 6}, rep.ByStatus)
		assert.Zero(t, rep.Overall.Total.Count, "latencies count ok requests only")
		for _, res := range rep.All() {
			assert.Equal(t, stream, res.SSEError)
		}
	}
}

func TestStreamWithoutDoneIsAFailure(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
	}))
	t.Cleanup(hs.Close)
	rep := run(t, Config{Targets: []string{hs.URL}, Clients: 1, Requests: 1, Stream: true, Tokens: -1, Delay: -1})
	assert.Equal(t, 1, rep.Failed)
	assert.Equal(t, map[string]int{"stream ended without [DONE]": 1}, rep.Errors)
}

func TestSlowAnswerTimesOut(t *testing.T) {
	t.Parallel()
	_, u := startMock(t)
	rep := run(t, Config{Targets: []string{u}, Clients: 1, Requests: 1, Tokens: 1, Delay: 5 * time.Second, Timeout: 50 * time.Millisecond})
	assert.Equal(t, 1, rep.Failed)
	assert.Equal(t, map[string]int{"timeout": 1}, rep.Errors)
}

func TestCancelCutsRunningRequests(t *testing.T) {
	t.Parallel()
	m, u := startMock(t)
	r, err := New(Config{Targets: []string{u}, Clients: 3, Requests: 3, Stream: true, Tokens: 1, Delay: 10 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for r.Counters().Granted.Load() < 3 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	rep, err := r.Run(ctx)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, 3, rep.Canceled)
	assert.Eventually(t, func() bool { return m.Canceled() == 3 }, 2*time.Second, 10*time.Millisecond)
}

func TestRequestBodyIsValidJSONWithThePromptSize(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 16, 1024, 65536} {
		var req struct {
			Model    string `json:"model"`
			Stream   bool   `json:"stream"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(requestBody("m", true, n), &req))
		assert.Equal(t, "m", req.Model)
		assert.True(t, req.Stream)
		require.Len(t, req.Messages, 1)
		assert.Len(t, req.Messages[0].Content, n)
	}
}

func TestPercentileIsNearestRank(t *testing.T) {
	t.Parallel()
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0, time.Millisecond}} {
		assert.Equal(t, tc.want, Percentile(ds, tc.p), "p%v", tc.p)
	}
	l := Summarize([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	assert.Equal(t, Latency{Count: 3, Mean: 2, P50: 2, P90: 3, P99: 3, Max: 3}, l)
}

func TestConfigRejectsAmbiguousLoads(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"no target":             {Clients: 1, Requests: 1},
		"both loops":            {Targets: []string{"x"}, Clients: 1, Rate: 1, Duration: time.Second},
		"open without duration": {Targets: []string{"x"}, Rate: 1},
		"closed without end":    {Targets: []string{"x"}, Clients: 1},
		"no load":               {Targets: []string{"x"}},
	} {
		_, err := New(cfg)
		assert.Error(t, err, name)
	}
}

func TestProgressShowsQueueDepthAndUpstreamConcurrency(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	ctx := context.Background()
	require.NoError(t, rdb.ZAdd(ctx, "{fair_queue:q1}:waiting", redisZ("a", 1), redisZ("b", 2), redisZ("c", 3)).Err())
	require.NoError(t, rdb.ZAdd(ctx, "{fair_queue:q1}:holders", redisZ("d", 1)).Err())

	_, u := startMock(t)
	r, err := New(Config{Targets: []string{u}, Clients: 2, Requests: 4, Tokens: 1, Delay: 100 * time.Millisecond})
	require.NoError(t, err)
	var out bytes.Buffer
	mon := StartProgress(r, &out, ProgressConfig{
		Every: 20 * time.Millisecond, RedisAddr: rs.Addr(), Queue: "q1", UpstreamStats: u + "/stats",
	})
	_, err = r.Run(ctx)
	require.NoError(t, err)
	obs := mon.Stop()

	assert.Equal(t, int64(3), obs.MaxWaiting)
	assert.Equal(t, int64(1), obs.MaxHolders)
	assert.Equal(t, 2, obs.Upstream.MaxInFlight)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	assert.Greater(t, len(lines), 3)
	assert.Contains(t, out.String(), "queue depth 3  permits held 1")
	assert.Contains(t, lines[len(lines)-1], "sent 4  in flight 0  granted 4  ok 4")
}

func redisZ(member string, score float64) redis.Z { return redis.Z{Member: member, Score: score} }
