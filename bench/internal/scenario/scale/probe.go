package scale

// What the scale scenario measures around its loads: CPU windows, Redis
// round trips, memory, commands and queue depth.

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// probeRedis times no-op script calls, one per ms, for d, into h, in
// the background; wait for the returned channel.
func probeRedis(ctx context.Context, b *scenario.Runner, d time.Duration, h *report.Handoffs) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := scenario.RTTScript.Load(ctx, b.RDB).Err(); err != nil {
			return
		}
		var rtts []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
			time.Sleep(time.Millisecond)
			t0 := time.Now()
			if scenario.RTTScript.EvalSha(ctx, b.RDB, nil).Err() != nil {
				return
			}
			rtts = append(rtts, time.Since(t0))
		}
		slices.Sort(rtts)
		h.RedisRTTP50, h.RedisRTTP99 = report.MSOf(loadgen.Percentile(rtts, 50)), report.MSOf(loadgen.Percentile(rtts, 99))
	}()
	return done
}

// parseCPULine returns the busy and total jiffies of the "cpu" line of
// /proc/stat ("cpu  user nice system idle iowait irq softirq steal ...").
func parseCPULine(stat string) (busy, total int64, ok bool) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	var idle int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i >= 8 { // guest and guest_nice are inside user and nice
			break
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return total - idle, total, true
}

// cpuWindow samples the machine's and some processes' CPU time at the
// start of a window; end returns the shares over it.
type cpuWindow struct {
	at          time.Time
	busy, total int64
	caddy       time.Duration
	redis       time.Duration
	clients     time.Duration
}

func machineCPU() (busy, total int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	busy, total, _ = parseCPULine(string(data))
	return busy, total
}

func startCPUWindow(caddy []int, redis int, clients []int) cpuWindow {
	w := cpuWindow{at: time.Now()}
	w.busy, w.total = machineCPU()
	w.caddy, _ = procs.CPUOf(caddy)
	w.redis, _ = procs.CPUTime(redis)
	w.clients, _ = procs.CPUOf(clients)
	return w
}

// end fills h's CPU figures over the window.
func (w cpuWindow) end(h *report.Handoffs, caddy []int, redis int, clients []int) {
	busy, total := machineCPU()
	if total > w.total {
		h.MachineBusy = report.Round(float64(busy-w.busy)/float64(total-w.total), 3)
	}
	s := time.Since(w.at).Seconds()
	if c, err := procs.CPUOf(caddy); err == nil {
		h.CaddyCores = report.Round((c-w.caddy).Seconds()/s, 3)
	}
	if c, err := procs.CPUTime(redis); err == nil {
		h.RedisCores = report.Round((c-w.redis).Seconds()/s, 3)
	}
	if len(clients) > 0 {
		if c, err := procs.CPUOf(clients); err == nil {
			h.ClientCores = report.Round((c-w.clients).Seconds()/s, 3)
		}
	}
}

func procPIDs(ps []*procs.Proc) []int {
	pids := make([]int, 0, len(ps))
	for _, p := range ps {
		if !p.Exited() {
			pids = append(pids, p.PID())
		}
	}
	return pids
}

// parseInfoInt returns the integer field of an INFO reply ("used_memory").
func parseInfoInt(info, field string) (int64, bool) {
	for line := range strings.SplitSeq(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// redisUsedMemory reads INFO memory used_memory.
func redisUsedMemory(ctx context.Context, b *scenario.Runner) (int64, error) {
	info, err := b.RDB.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	n, ok := parseInfoInt(info, "used_memory")
	if !ok {
		return 0, errors.New("no used_memory in INFO memory")
	}
	return n, nil
}

// idleOver returns the Redis commands and script calls per second over
// d, and the calls per command.
func idleOver(ctx context.Context, b *scenario.Runner, d time.Duration) (cmds, scripts float64, calls procs.CommandStats, err error) {
	before, err := procs.ReadCommandStats(ctx, b.RDB)
	if err != nil {
		return 0, 0, nil, err
	}
	start := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, 0, nil, ctx.Err()
	}
	after, err := procs.ReadCommandStats(ctx, b.RDB)
	if err != nil {
		return 0, 0, nil, err
	}
	diff := after.Sub(before)
	s := time.Since(start).Seconds()
	return report.Round(float64(diff.Total())/s, 1), report.Round(float64(diff.Scripts())/s, 1), diff, nil
}

// queueDepth is the waiters of queue in Redis: ZCARD of the waiting set
// plus the fair tickets; -1 when unreadable.
func queueDepth(ctx context.Context, b *scenario.Runner, queue string) int64 {
	tag := "{fair_queue:" + queue + "}"
	n, err := b.RDB.ZCard(ctx, tag+":waiting").Result()
	if err != nil {
		return -1
	}
	f, err := b.RDB.HLen(ctx, tag+":fticket").Result()
	if err != nil {
		return -1
	}
	return n + f
}

// rssSum sums the VmRSS of pids.
func rssSum(pids []int) (int64, error) { return procs.SumOver(pids, procs.RSS) }
