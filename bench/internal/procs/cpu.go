package procs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// parseProcStat returns utime and stime (fields 14 and 15, in clock
// ticks) of a /proc/<pid>/stat line. The second field, the command name
// in parentheses, may itself hold spaces and parentheses: the fields are
// counted from the last ')'.
func parseProcStat(stat string) (utime, stime int64, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || !strings.Contains(stat[:i], "(") {
		return 0, 0, errors.New("proc stat: no (comm)")
	}
	// f[0] is field 3 (state): field n is f[n-3].
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("proc stat: %d fields after comm, want at least 13", len(f))
	}
	if utime, err = strconv.ParseInt(f[14-3], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("proc stat utime: %w", err)
	}
	if stime, err = strconv.ParseInt(f[15-3], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("proc stat stime: %w", err)
	}
	if utime < 0 || stime < 0 {
		return 0, 0, errors.New("proc stat: negative CPU time")
	}
	return utime, stime, nil
}

var (
	clkTckOnce sync.Once
	clkTck     int64
)

// clockTicks returns the clock ticks per second of /proc's CPU times
// (getconf CLK_TCK), 100 when getconf fails.
func clockTicks() int64 {
	clkTckOnce.Do(func() {
		clkTck = 100
		out, err := exec.Command("getconf", "CLK_TCK").Output()
		if err != nil {
			return
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			clkTck = n
		}
	})
	return clkTck
}

// ticksToDuration converts clock ticks at hz per second to a duration.
func ticksToDuration(ticks, hz int64) time.Duration {
	return time.Duration(ticks) * time.Second / time.Duration(hz)
}

// CPUTime returns the user+system CPU time process pid (all its threads)
// has consumed so far, from /proc/<pid>/stat.
func CPUTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	u, s, err := parseProcStat(string(data))
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return ticksToDuration(u+s, clockTicks()), nil
}

// CPUOf returns the CPU time of every process of pids together.
func CPUOf(pids []int) (time.Duration, error) { return SumOver(pids, CPUTime) }

// SumOver adds up of(pid) over pids; the first error ends it.
func SumOver[T int64 | time.Duration](pids []int, of func(int) (T, error)) (T, error) {
	var sum T
	for _, pid := range pids {
		v, err := of(pid)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}
