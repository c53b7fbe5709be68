package procs

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCommandStatsCountScriptsAndLeaveOutTheBenchsOwnCalls(t *testing.T) {
	t.Parallel()
	cs := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=1,usec=10,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_zadd:calls=7,usec=7,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n")
	assert.Equal(t, CommandStats{"evalsha": 12, "eval": 1, "zadd": 7, "info": 3, "config|resetstat": 1}, cs)
	assert.Equal(t, int64(13), cs.Scripts())
	assert.Equal(t, int64(20), cs.Total())
	assert.Equal(t, CommandStats{"evalsha": 2}, cs.Sub(CommandStats{"evalsha": 10, "eval": 1, "zadd": 7, "info": 3, "config|resetstat": 1}))
}

func TestProcsStopEveryProcessTheyStarted(t *testing.T) {
	t.Parallel()
	ps := NewProcs(t.TempDir())
	a, err := ps.Start("a", "sleep", "60")
	require.NoError(t, err)
	b, err := ps.Start("b", "sh", "-c", "trap '' TERM; sleep 60") // ignores SIGTERM
	require.NoError(t, err)
	rss, err := RSS(a.PID())
	require.NoError(t, err)
	assert.Positive(t, rss)

	start := time.Now()
	ps.Stop(a)
	assert.True(t, a.Exited())
	assert.False(t, b.Exited())
	ps.StopAll()
	assert.True(t, b.Exited(), "killed after the grace period")
	assert.Less(t, time.Since(start), 10*time.Second)
}

func TestWaitListenReportsAProcessThatDied(t *testing.T) {
	t.Parallel()
	ps := NewProcs(t.TempDir())
	t.Cleanup(ps.StopAll)
	p, err := ps.Start("dies", "sh", "-c", "echo boom; exit 3")
	require.NoError(t, err)
	err = p.WaitListen(t.Context(), "127.0.0.1:1", 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "boom")
}

func TestEstablishedCountsConnectionsToAPort(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	for range 3 {
		c, err := net.Dial("tcp4", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
	}
	n, err := Established(port)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
}
