package procs

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statLine builds a /proc/<pid>/stat line: pid, (comm), then fields 3 to
// 52 with utime (14) and stime (15) set.
func statLine(comm string, utime, stime string) string {
	f := make([]string, 50) // fields 3..52
	for i := range f {
		f[i] = "0"
	}
	f[0] = "S"
	f[14-3], f[15-3] = utime, stime
	f[16-3], f[17-3] = "777", "888" // cutime, cstime: children, not counted
	return "4242 (" + comm + ") " + strings.Join(f, " ") + "\n"
}

func TestParseProcStatReadsUtimeAndStimeAfterTheLastParen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		stat         string
		utime, stime int64
		err          bool
	}{
		{name: "plain", stat: statLine("caddy", "1234", "567"), utime: 1234, stime: 567},
		{name: "space in comm", stat: statLine("redis server", "10", "20"), utime: 10, stime: 20},
		// Counting fields from the first ')' would shift them by the
		// words after it.
		{name: "parens and spaces in comm", stat: statLine("a) 1 2 (b) c", "31", "41"), utime: 31, stime: 41},
		{name: "comm ends in paren", stat: statLine("x)", "5", "6"), utime: 5, stime: 6},
		{name: "real haproxy line", utime: 193, stime: 88,
			stat: "98765 (haproxy) S 1 98765 98765 0 -1 4194560 2398 0 0 0 193 88 0 0 20 0 2 0 123456 " +
				"30000000 2000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"},
		{name: "no comm", stat: "4242 caddy S 0 0", err: true},
		{name: "too short", stat: "4242 (caddy) S 1 2 3 4 5 6 7 8 9 10 11", err: true},
		{name: "utime not a number", stat: statLine("caddy", "x", "1"), err: true},
		{name: "stime not a number", stat: statLine("caddy", "1", "1.5"), err: true},
		{name: "negative", stat: statLine("caddy", "-1", "1"), err: true},
		{name: "empty", stat: "", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, s, err := parseProcStat(tc.stat)
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.utime, u, "utime")
			assert.Equal(t, tc.stime, s, "stime")
		})
	}
}

func TestCPUTimeOfThisProcessGrowsWithWork(t *testing.T) {
	t.Parallel()
	before, err := CPUTime(os.Getpid())
	require.NoError(t, err)
	x := 0
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		x++
	}
	after, err := CPUTime(os.Getpid())
	require.NoError(t, err)
	assert.Greater(t, after, before, "%d iterations", x)
	_, err = CPUTime(-1)
	assert.Error(t, err)
}

func TestTicksToDuration(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 10*time.Millisecond, ticksToDuration(1, 100))
	assert.Equal(t, 2500*time.Millisecond, ticksToDuration(250, 100))
	assert.Equal(t, time.Second, ticksToDuration(1000, 1000))
}
