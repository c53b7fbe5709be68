package scenario

import (
	"errors"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
)

// cpuSample is the CPU time of a system's processes at one instant.
type cpuSample struct {
	proxy, redis time.Duration
	err          error
}

// sampleCPU reads the CPU time of the proxy processes and, when redis is
// not 0, of redis-server.
func sampleCPU(proxy []int, redis int) cpuSample {
	var s cpuSample
	s.proxy, s.err = procs.CPUOf(proxy)
	if s.err == nil && redis != 0 {
		s.redis, s.err = procs.CPUTime(redis)
	}
	return s
}

// perRequestMS returns cpu / requests in milliseconds, rounded to the
// microsecond; 0 when no request was served or the CPU time went
// backwards (a process restarted).
func perRequestMS(cpu time.Duration, requests int) float64 {
	if requests <= 0 || cpu < 0 {
		return 0
	}
	return report.Round(float64(cpu)/float64(time.Millisecond)/float64(requests), 4)
}

// recordCPU fills the CPU figures of run from the samples taken at the
// start and the end of its window, requests being those served in it.
func recordCPU(run *report.LoadRun, start, end cpuSample, requests int, redis bool) error {
	if start.err != nil {
		return start.err
	}
	if end.err != nil {
		return end.err
	}
	proxy, rd := end.proxy-start.proxy, end.redis-start.redis
	if proxy < 0 || rd < 0 {
		return errors.New("CPU time went backwards: a process restarted")
	}
	run.CPURequests = requests
	run.ProxyCPUMS = report.MSOf(proxy)
	run.ProxyCPUPerRequest = perRequestMS(proxy, requests)
	if redis {
		run.RedisCPUMS = report.MSOf(rd)
		run.RedisCPUPerRequest = perRequestMS(rd, requests)
	}
	return nil
}
