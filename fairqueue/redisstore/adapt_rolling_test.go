package redisstore

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/headsttl"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A rolling upgrade: an instance of the version before the plain answers
// (AdaptReport.Answered) runs its own adapt script
// (testdata/adapt_before_answered.lua, five values per share) beside
// this one's. Its moves reset the window it knows (n, o, r, l), not the
// plain answers it never heard of: those counted before its move must not
// count in the window after it. Else a window after a refusal brought the
// share down ripens with fewer plain answers than min_samples, and the
// share climbs back one interval after the refusal.
func TestPlainAnswersOfAWindowAnEarlierVersionMovedDoNotCountAfterIt(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := New(rdb, "adaptrolling", Options{})
	src, err := os.ReadFile("testdata/adapt_before_answered.lua")
	require.NoError(t, err)
	var b strings.Builder
	b.WriteString(keyTable())
	for _, f := range prelude {
		lua, err := luaFS.ReadFile("lua/" + f + ".lua")
		require.NoError(t, err)
		b.Write(lua)
		b.WriteString("\n")
	}
	b.Write(src)
	before := redis.NewScript(b.String())
	const interval = 20 * time.Millisecond
	args := func(r fairqueue.AdaptReport) fairqueue.AdaptArgs {
		return fairqueue.AdaptArgs{Node: "new", Limited: true, Floor: 0.1, Decrease: 0.5, Step: 0.25, BreachShare: 0.5,
			Interval: interval, MinSamples: 10, Reports: []fairqueue.AdaptReport{r}}
	}
	// This version's instance: 9 plain answers, one short of min_samples.
	_, err = s.Adapt(ctx, args(fairqueue.AdaptReport{Answered: 9}))
	require.NoError(t, err)
	// The earlier version's instance: a refusal halves the share and
	// starts a new window.
	time.Sleep(2 * interval)
	require.NoError(t, before.Run(ctx, rdb, s.keys, s.args("old", fairqueue.Limits{},
		1, "0.1", "0.5", "0.25", "0.5", interval.Milliseconds(), 10, headsttl.Of(fairqueue.HeadsTTL).Milliseconds(),
		"", 0, 0, 1, "")...).Err())
	got, err := s.Adapt(ctx, args(fairqueue.AdaptReport{}))
	require.NoError(t, err)
	require.Equal(t, 0.5, got[""], "the earlier version's instance saw a refusal")
	// One plain answer in the new window, after its interval.
	time.Sleep(2 * interval)
	got, err = s.Adapt(ctx, args(fairqueue.AdaptReport{Answered: 1}))
	require.NoError(t, err)
	require.Equal(t, 0.5, got[""],
		"one plain answer after the refusal's window grew the share: the 9 of the window before counted in it")
}
