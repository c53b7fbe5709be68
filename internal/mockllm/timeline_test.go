package mockllm

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTimelineIsOffByDefault(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{Tokens: 1, Delay: time.Millisecond})
	resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Eventually(t, func() bool { return s.Served() == 1 }, time.Second, time.Millisecond)
	st := s.Stats()
	assert.Zero(t, st.BusyMS)
	assert.Nil(t, st.HandoffGapsUS)
}

func TestTimelineRecordsGapFromEachEndToTheNextArrival(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{Tokens: 1, Delay: 20 * time.Millisecond, Timeline: true})
	send := func() {
		resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Two at once, then, after both ended and a pause, two more: the
	// first two arrivals follow no end; the last two each match one end.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(send)
	}
	wg.Wait()
	require.Eventually(t, func() bool { return s.Served() == 2 }, time.Second, time.Millisecond)
	time.Sleep(30 * time.Millisecond)
	for range 2 {
		wg.Go(send)
	}
	wg.Wait()
	require.Eventually(t, func() bool { return s.Served() == 4 }, time.Second, time.Millisecond)

	st := s.Stats()
	require.Len(t, st.HandoffGapsUS, 2)
	for _, gap := range st.HandoffGapsUS {
		assert.GreaterOrEqual(t, gap, int64(30_000))
		assert.Less(t, gap, int64(2_000_000))
	}
	assert.GreaterOrEqual(t, st.BusyMS, 80.0, "4 answers of 20ms")

	s.Reset()
	st = s.Stats()
	assert.Empty(t, st.HandoffGapsUS)
	assert.Zero(t, st.BusyMS)
	send()
	assert.Empty(t, s.Stats().HandoffGapsUS, "ends before Reset are forgotten")
}

func TestTimelineIsServedByStats(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{Tokens: 1, Delay: time.Millisecond, Timeline: true})
	for range 2 {
		resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(5 * time.Millisecond)
	}
	resp, err := http.Get(hs.URL + "/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Contains(t, string(body), `"handoff_gaps_us":[`)
	assert.Contains(t, string(body), `"busy_ms":`)
}
