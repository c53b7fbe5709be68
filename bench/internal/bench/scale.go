package bench

// The scale scenario: tens of thousands of streams waiting across the 3
// Caddy nodes of one queue (Caddy RSS and Redis memory per waiter, Redis
// commands per second while they wait, handoff latency with the queue
// that deep), and 100 queues on one Redis. The clients run in several
// processes (the bench binary re-executed with -scale-client): one
// process cannot hold 50,000 connections under the open-file limit.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// ScaleSettings are the loads of the scale scenario.
type ScaleSettings struct {
	// Waiters is the number of streams queued across Nodes Caddy nodes,
	// by ClientProcs client processes, at RampRPS in all, each with a
	// PromptBytes prompt; BaseWaiters the shallow queue they are
	// compared with.
	Waiters     int     `json:"waiters"`
	Permits     int     `json:"permits"`
	BaseWaiters int     `json:"base_waiters"`
	Nodes       int     `json:"nodes"`
	ClientProcs int     `json:"client_procs"`
	RampRPS     float64 `json:"ramp_rps"`
	PromptBytes int     `json:"prompt_bytes"`
	// FDLimit is the open-file limit of every process (soft raised to
	// hard); FDReserve the descriptors a process keeps for other uses.
	FDLimit   int `json:"fd_limit"`
	FDReserve int `json:"fd_reserve"`
	// IdleWindowS is how long Redis commands are counted while idle;
	// HandoffWindowS how long handoffs are collected while the queue
	// drains.
	IdleWindowS    float64 `json:"idle_window_s"`
	HandoffWindowS float64 `json:"handoff_window_s"`
	// Queues, QueuePermits and QueueWaiters shape the many-queues run:
	// that many queue names on one node and one Redis, each with its
	// permits held and that many waiters.
	Queues       int `json:"queues"`
	QueuePermits int `json:"queue_permits"`
	QueueWaiters int `json:"queue_waiters"`
	// HandoffTolerance and HandoffSlackMS: the deep queue's handoff p99
	// passes when at most max(tolerance x, +slack ms) the shallow one's.
	HandoffTolerance float64 `json:"handoff_tolerance"`
	HandoffSlackMS   float64 `json:"handoff_slack_ms"`
}

// scaleSettings returns the scenario's loads for waiters streams (0: the
// default 50,000) and a limit of fdLimit open files per process.
func scaleSettings(waiters, fdLimit int) ScaleSettings {
	if waiters <= 0 {
		waiters = 50_000
	}
	// 700/s: at 1000/s on 2 cores some connects to the loaded nodes
	// timed out (loadgen's 5 s dial timeout) near 50,000 connections.
	s := ScaleSettings{
		Waiters: waiters, BaseWaiters: 100, Nodes: 3, RampRPS: 700, PromptBytes: 1 << 10,
		FDLimit: fdLimit, FDReserve: 2000, IdleWindowS: 10, HandoffWindowS: 5,
		Queues: 100, QueuePermits: 4, QueueWaiters: 5,
		HandoffTolerance: 1.25, HandoffSlackMS: 1,
	}
	s.ClientProcs = clientProcs(waiters, s.Nodes, fdLimit-s.FDReserve)
	return s
}

// clientProcs is how many client processes hold total connections, each
// under perProc: at least one per node, a multiple of the nodes (each
// process talks to one node, so every node gets as many).
func clientProcs(total, nodes, perProc int) int {
	if perProc <= 0 || nodes <= 0 {
		return max(nodes, 1)
	}
	n := (total + perProc - 1) / perProc
	n = max(n, nodes)
	if r := n % nodes; r != 0 {
		n += nodes - r
	}
	return n
}

// clientShare is the load of one client process: its node and its count.
type clientShare struct {
	Node    int `json:"node"`
	Waiters int `json:"waiters"`
}

// planClients splits total waiters over procs processes, process i
// talking to node i%nodes, the counts differing by at most one. It fails
// when a process or a node would need more than perProc connections
// (the open-file limit less a reserve): a node's Caddy holds every
// waiter sent to it.
func planClients(total, nodes, procs, perProc int) ([]clientShare, error) {
	if total < 0 || nodes <= 0 || procs <= 0 || procs%nodes != 0 {
		return nil, fmt.Errorf("cannot split %d waiters over %d processes and %d nodes", total, procs, nodes)
	}
	shares := make([]clientShare, procs)
	perNode := make([]int, nodes)
	for i := range shares {
		n := total / procs
		if i < total%procs {
			n++
		}
		shares[i] = clientShare{Node: i % nodes, Waiters: n}
		perNode[i%nodes] += n
		if n > perProc {
			return nil, fmt.Errorf("client process %d would hold %d connections, over %d", i, n, perProc)
		}
	}
	for node, n := range perNode {
		if n > perProc {
			return nil, fmt.Errorf("node %d would hold %d connections, over %d", node, n, perProc)
		}
	}
	return shares, nil
}

// Scale is the outcome of the scale scenario.
type Scale struct {
	Settings ScaleSettings `json:"settings"`
	// System describes the queue; Clients the client processes.
	System  string        `json:"system"`
	Clients []clientShare `json:"clients,omitempty"`
	// Queued is the depth reached (Redis ZCARD + fair tickets) beyond the
	// BaseWaiters; MaxDepth the deepest seen.
	Queued   int64 `json:"queued"`
	MaxDepth int64 `json:"max_depth"`
	// RSSBefore and RSSAfter are the 3 nodes' VmRSS summed, with the base
	// waiters and with all of them; RSSPerWaiterKiB the delta per waiter.
	RSSBefore       int64   `json:"rss_before_bytes"`
	RSSAfter        int64   `json:"rss_after_bytes"`
	RSSPerWaiterKiB float64 `json:"rss_per_waiter_kib"`
	// RedisMemBefore/After are INFO memory used_memory at the same two
	// moments; RedisPerWaiterKiB the delta per waiter.
	RedisMemBefore    int64   `json:"redis_used_memory_before"`
	RedisMemAfter     int64   `json:"redis_used_memory_after"`
	RedisPerWaiterKiB float64 `json:"redis_per_waiter_kib"`
	// BaseCmdsPerS and IdleCmdsPerS are Redis commands per second, all
	// permits held, with BaseWaiters and with every waiter queued;
	// *ScriptsPerS the script calls among them.
	BaseCmdsPerS    float64 `json:"redis_cmds_per_s_base"`
	BaseScriptsPerS float64 `json:"redis_scripts_per_s_base"`
	IdleCmdsPerS    float64 `json:"redis_cmds_per_s"`
	IdleScriptsPerS float64 `json:"redis_scripts_per_s"`
	// IdleCommands are the calls per command over the deep queue's idle
	// window.
	IdleCommands CommandStats `json:"redis_idle_commands,omitempty"`
	// HandoffBase is measured with BaseWaiters always waiting (a closed
	// loop of permits + BaseWaiters clients), HandoffDeep while the deep
	// queue drains after the permits are released.
	HandoffBase *Handoffs `json:"handoff_base,omitempty"`
	HandoffDeep *Handoffs `json:"handoff_deep,omitempty"`
	// UpstreamMaxHeld is the upstream's highest concurrency while every
	// permit was held; UpstreamMaxFlow while the queue drained.
	UpstreamMaxHeld int `json:"upstream_max_held"`
	UpstreamMaxFlow int `json:"upstream_max_flow"`
	// Served, Failed, Rejected and Dropped count the waiters that got an
	// answer while every permit was held (without a permit), failed,
	// were rejected or not sent, before the release.
	Served   int64 `json:"served_while_held"`
	Failed   int64 `json:"failed"`
	Rejected int64 `json:"rejected"`
	Dropped  int64 `json:"dropped"`
	// Reasons counts rejects by Fair-Queue-Reason over the whole run;
	// Errors the client processes' failures by message (the run's end
	// cancels every request: those are not counted).
	Reasons map[string]int `json:"reasons,omitempty"`
	Errors  map[string]int `json:"errors,omitempty"`
	// Note says what went wrong, if anything: the bound reached.
	Note string `json:"note,omitempty"`
	// Queues is the many-queues run.
	Queues *ScaleQueues `json:"queues,omitempty"`
}

// Handoffs are the gaps from a completion's end to the upstream arrival
// of the request that took its permit (mockllm -timeline), in ms.
type Handoffs struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
	// Depth is the queue depth when they were read.
	Depth int64 `json:"depth"`
	// MachineBusy is the share of all CPUs busy over the window
	// (/proc/stat); CaddyCores, RedisCores and ClientCores the CPU the
	// Caddy nodes, redis-server and the client processes used, in cores.
	MachineBusy float64 `json:"machine_busy"`
	CaddyCores  float64 `json:"caddy_cores"`
	RedisCores  float64 `json:"redis_cores"`
	ClientCores float64 `json:"client_cores,omitempty"`
	// RedisRTTP50 and RedisRTTP99 are the round trips of a no-op script
	// call from the bench, one every ms over the window: whether Redis
	// itself stalled.
	RedisRTTP50 float64 `json:"redis_rtt_p50_ms"`
	RedisRTTP99 float64 `json:"redis_rtt_p99_ms"`
}

// probeRedis times no-op script calls, one per ms, for d, into h, in
// the background; wait for the returned channel.
func (b *bench) probeRedis(ctx context.Context, d time.Duration, h *Handoffs) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rttScript.Load(ctx, b.rdb).Err(); err != nil {
			return
		}
		var rtts []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
			time.Sleep(time.Millisecond)
			t0 := time.Now()
			if rttScript.EvalSha(ctx, b.rdb, nil).Err() != nil {
				return
			}
			rtts = append(rtts, time.Since(t0))
		}
		slices.Sort(rtts)
		h.RedisRTTP50, h.RedisRTTP99 = msOf(loadgen.Percentile(rtts, 50)), msOf(loadgen.Percentile(rtts, 99))
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
	w.caddy, _ = cpuOf(caddy)
	w.redis, _ = CPUTime(redis)
	w.clients, _ = cpuOf(clients)
	return w
}

// end fills h's CPU figures over the window.
func (w cpuWindow) end(h *Handoffs, caddy []int, redis int, clients []int) {
	busy, total := machineCPU()
	if total > w.total {
		h.MachineBusy = round(float64(busy-w.busy)/float64(total-w.total), 3)
	}
	s := time.Since(w.at).Seconds()
	if c, err := cpuOf(caddy); err == nil {
		h.CaddyCores = round((c-w.caddy).Seconds()/s, 3)
	}
	if c, err := CPUTime(redis); err == nil {
		h.RedisCores = round((c-w.redis).Seconds()/s, 3)
	}
	if len(clients) > 0 {
		if c, err := cpuOf(clients); err == nil {
			h.ClientCores = round((c-w.clients).Seconds()/s, 3)
		}
	}
}

func procPIDs(ps []*Proc) []int {
	pids := make([]int, 0, len(ps))
	for _, p := range ps {
		if !p.Exited() {
			pids = append(pids, p.PID())
		}
	}
	return pids
}

// ScaleQueues is the many-queues run: one node, one handler naming its
// queue from a header, on one Redis.
type ScaleQueues struct {
	// Queues is how many were opened (Settings.Queues unless it failed).
	Queues int `json:"queues"`
	// OneCmdsPerS and ManyCmdsPerS are the idle Redis commands per second
	// with one queue and with all of them, each holding its permits and
	// waiters; OneMem and ManyMem the used_memory growth over the empty
	// node (bytes).
	OneCmdsPerS  float64 `json:"redis_cmds_per_s_one"`
	ManyCmdsPerS float64 `json:"redis_cmds_per_s_many"`
	OneMem       int64   `json:"redis_mem_one_bytes"`
	ManyMem      int64   `json:"redis_mem_many_bytes"`
	// ManyCommands are the calls per command over the idle window with
	// every queue open.
	ManyCommands CommandStats `json:"redis_idle_commands_many,omitempty"`
	// RSSOne and RSSMany are the node's VmRSS at the same moments.
	RSSOne  int64 `json:"rss_one_bytes"`
	RSSMany int64 `json:"rss_many_bytes"`
	// Waiting is the waiters seen queued over all queues; Served, Failed
	// and Rejected what happened to them while every permit was held.
	Waiting  int64  `json:"waiting"`
	Served   int64  `json:"served_while_held"`
	Failed   int64  `json:"failed"`
	Rejected int64  `json:"rejected"`
	Note     string `json:"note,omitempty"`
}

// RaiseFileLimit raises the soft open-file limit to the hard one. The
// processes the bench starts inherit it.
func RaiseFileLimit() (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return int(lim.Cur), err
		}
	}
	return int(lim.Cur), nil
}

// fileLimit returns the soft open-file limit.
func fileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return int(min(lim.Cur, 1<<30))
}

// clientCounters is a line a client process prints: its counters.
type clientCounters struct {
	Sent     int64          `json:"sent"`
	Granted  int64          `json:"granted"`
	Failed   int64          `json:"failed"`
	Rejected int64          `json:"rejected"`
	Dropped  int64          `json:"dropped"`
	InFlight int64          `json:"in_flight"`
	Final    bool           `json:"final,omitempty"`
	Reasons  map[string]int `json:"reasons,omitempty"`
	// Errors counts the failures by error message (final line only).
	Errors map[string]int `json:"errors,omitempty"`
	Error  string         `json:"error,omitempty"`
}

// RunScaleClient is a client process of the scale scenario: it runs the
// loadgen config in file cfgPath until ctx ends, printing its counters as
// one JSON line every 250 ms and a final one.
func RunScaleClient(ctx context.Context, cfgPath string, out io.Writer) error {
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var cfg loadgen.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	r, err := loadgen.New(cfg)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	snap := func() clientCounters {
		c := r.Counters()
		return clientCounters{Sent: c.Sent.Load(), Granted: c.Granted.Load(), Failed: c.Failed.Load(),
			Rejected: c.Rejected.Load(), Dropped: c.Dropped.Load(), InFlight: c.InFlight.Load()}
	}
	done := make(chan struct{})
	var rep *loadgen.Report
	var runErr error
	go func() {
		defer close(done)
		rep, runErr = r.Run(ctx)
	}()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			_ = enc.Encode(snap())
		case <-done:
			c := snap()
			c.Final = true
			if rep != nil {
				c.Reasons, c.Errors = rep.ByReason, rep.Errors
			}
			if runErr != nil && !errors.Is(runErr, context.Canceled) {
				c.Error = runErr.Error()
			}
			return enc.Encode(c)
		}
	}
}

// parseLastCounters returns the last counters line of a client's output
// (other lines, and a last line cut short, are skipped).
func parseLastCounters(data []byte) (clientCounters, bool) {
	var last clientCounters
	found := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var c clientCounters
		if json.Unmarshal(line, &c) == nil {
			last, found = c, true
		}
	}
	return last, found
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
func (b *bench) redisUsedMemory(ctx context.Context) (int64, error) {
	info, err := b.rdb.Info(ctx, "memory").Result()
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
func (b *bench) idleOver(ctx context.Context, d time.Duration) (cmds, scripts float64, calls CommandStats, err error) {
	before, err := ReadCommandStats(ctx, b.rdb)
	if err != nil {
		return 0, 0, nil, err
	}
	start := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, 0, nil, ctx.Err()
	}
	after, err := ReadCommandStats(ctx, b.rdb)
	if err != nil {
		return 0, 0, nil, err
	}
	diff := after.Sub(before)
	s := time.Since(start).Seconds()
	return round(float64(diff.Total())/s, 1), round(float64(diff.Scripts())/s, 1), diff, nil
}

// queueDepth is the waiters of queue in Redis: ZCARD of the waiting set
// plus the fair tickets; -1 when unreadable.
func (b *bench) queueDepth(ctx context.Context, queue string) int64 {
	tag := "{fair_queue:" + queue + "}"
	n, err := b.rdb.ZCard(ctx, tag+":waiting").Result()
	if err != nil {
		return -1
	}
	f, err := b.rdb.HLen(ctx, tag+":fticket").Result()
	if err != nil {
		return -1
	}
	return n + f
}

// rssSum sums the VmRSS of pids.
func rssSum(pids []int) (int64, error) { return sumOver(pids, RSS) }

// startNodes starts spec's nodes, queue naming fair_queue's queue (a
// placeholder for the many-queues run), on env (its own max_wait).
func startNodes(ctx context.Context, env *Env, spec Spec, queue string) (*Running, error) {
	ports, err := FreePorts(spec.Nodes)
	if err != nil {
		return nil, err
	}
	r := &Running{Spec: spec, Queue: queue}
	for i, port := range ports {
		name := spec.Name
		if spec.Nodes > 1 {
			name += "-" + strconv.Itoa(i+1)
		}
		listen := "127.0.0.1:" + strconv.Itoa(port)
		p, err := env.startNode(name, listen, spec, queue)
		if err != nil {
			env.Stop(r)
			return nil, err
		}
		r.procs = append(r.procs, p)
		if err := p.WaitListen(ctx, listen, 15*time.Second); err != nil {
			env.Stop(r)
			return nil, err
		}
		r.Targets = append(r.Targets, "http://"+listen)
	}
	return r, nil
}

// startLoad runs cfg in a goroutine until canceled.
func startLoad(ctx context.Context, cfg loadgen.Config) (*background, error) {
	r, err := loadgen.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	bg := &background{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(bg.done)
		bg.rep, _ = r.Run(ctx)
	}()
	return bg, nil
}

// holdConfig takes n permits with streams that last minutes; waitConfig
// queues n streams arriving at rate per second (each a 10 ms answer once
// served).
func holdConfig(targets []string, n int, header map[string]string) loadgen.Config {
	cfg := loadgen.Config{
		Targets: targets, PromptBytes: 16, Clients: n, Requests: n, MaxInFlight: n,
		Stream: true, Tokens: 1, Delay: 10 * time.Minute, Timeout: 30 * time.Minute,
	}
	setHeader(&cfg, header)
	return cfg
}

func waitConfig(targets []string, n, promptBytes int, rate float64, header map[string]string) loadgen.Config {
	cfg := loadgen.Config{
		Targets: targets, PromptBytes: promptBytes, MaxInFlight: n + 16,
		Rate: rate, Duration: time.Duration((float64(n) - 0.5) / rate * float64(time.Second)),
		Stream: true, Tokens: 1, Delay: 10 * time.Millisecond, Timeout: 30 * time.Minute,
	}
	setHeader(&cfg, header)
	return cfg
}

func setHeader(cfg *loadgen.Config, header map[string]string) {
	for k, v := range header {
		if cfg.Header == nil {
			cfg.Header = map[string][]string{}
		}
		cfg.Header.Set(k, v)
	}
}

// handoffs reads mockllm's handoff gaps since its last reset.
func (b *bench) handoffs(ctx context.Context) (*Handoffs, int, error) {
	st, err := b.mockStats(ctx)
	if err != nil {
		return nil, 0, err
	}
	gaps := make([]time.Duration, len(st.HandoffGapsUS))
	for i, us := range st.HandoffGapsUS {
		gaps[i] = time.Duration(us) * time.Microsecond
	}
	slices.Sort(gaps)
	return &Handoffs{Count: len(gaps), P50: msOf(loadgen.Percentile(gaps, 50)), P90: msOf(loadgen.Percentile(gaps, 90)),
			P99: msOf(loadgen.Percentile(gaps, 99)), Max: msOf(loadgen.Percentile(gaps, 100))},
		st.MaxInFlight, nil
}

// resetMock zeroes mockllm's stats only.
func (b *bench) resetMock(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.mockURL+"/stats/reset", nil)
	if err != nil {
		return err
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runScale runs the scale scenario: the deep queue, then the many
// queues.
func (b *bench) runScale(ctx context.Context) {
	set := scaleSettings(b.opts.ScaleWaiters, fileLimit())
	set.Permits = b.env.Permits
	if b.opts.ScaleRPS > 0 {
		set.RampRPS = b.opts.ScaleRPS
	}
	s := &Scale{Settings: set}
	b.res.Scale = s
	env := *b.env
	env.MaxWait = 30 * time.Minute // the deep queue drains for minutes
	spec := Spec{Name: "fq-scale", Label: "fair_queue Redis 3 nodes (scale)", Kind: KindFairQueue, Nodes: set.Nodes, Redis: true}
	s.System = fmt.Sprintf("fair_queue Redis %d nodes, one queue, %d permits", set.Nodes, env.Permits)
	b.logf("== scale: %d waiters over %d nodes from %d client processes at %.0f/s, %s prompts (open-file limit %d)",
		set.Waiters, set.Nodes, set.ClientProcs, set.RampRPS, sizeLabel(set.PromptBytes), set.FDLimit)
	if err := b.scaleDeep(ctx, &env, spec, s); err != nil {
		s.Note = strings.TrimSpace(s.Note + " " + err.Error())
		b.logf("   deep queue: %v", err)
	}
	if ctx.Err() != nil {
		return
	}
	q, err := b.scaleQueues(ctx, &env, set)
	if err != nil {
		q.Note = strings.TrimSpace(q.Note + " " + err.Error())
		b.logf("   %d queues: %v", set.Queues, err)
	}
	s.Queues = q
}

// scaleDeep measures the deep queue of one queue over set.Nodes nodes.
func (b *bench) scaleDeep(ctx context.Context, env *Env, spec Spec, s *Scale) error {
	set := s.Settings
	permits := env.Permits
	shares, err := planClients(set.Waiters, set.Nodes, set.ClientProcs, set.FDLimit-set.FDReserve)
	if err != nil {
		return err
	}
	s.Clients = shares
	r, err := startNodes(ctx, env, spec, "bench-scale")
	if err != nil {
		return err
	}
	var loads []*background
	var clients []*Proc
	defer func() {
		var wg sync.WaitGroup
		for _, p := range clients {
			wg.Go(func() { env.Procs.Stop(p) })
		}
		for _, bg := range loads {
			wg.Go(bg.stop)
		}
		wg.Wait()
		env.Stop(r)
		for _, p := range clients {
			if c, ok := readCounters(p); ok {
				for reason, n := range c.Reasons {
					if s.Reasons == nil {
						s.Reasons = map[string]int{}
					}
					s.Reasons[reason] += n
				}
				for msg, n := range c.Errors {
					if s.Errors == nil {
						s.Errors = map[string]int{}
					}
					s.Errors[genericError(msg)] += n
				}
			}
		}
	}()
	if err := b.warm(ctx, r); err != nil {
		return err
	}
	depth := func() int64 {
		d := b.queueDepth(ctx, r.Queue)
		s.MaxDepth = max(s.MaxDepth, d)
		return d
	}

	// Handoffs with BaseWaiters always waiting: a closed loop of
	// permits + BaseWaiters short streams.
	base, err := startLoad(ctx, loadgen.Config{
		Targets: r.Targets, Clients: permits + set.BaseWaiters, Duration: secs(set.HandoffWindowS + 3),
		Stream: true, Tokens: 1, Delay: 10 * time.Millisecond, PromptBytes: set.PromptBytes, Timeout: time.Minute,
	})
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, 1500*time.Millisecond); err != nil {
		return err
	}
	if err := b.resetMock(ctx); err != nil {
		return err
	}
	win := startCPUWindow(r.PIDs(), b.redisPID, nil)
	var probe Handoffs
	probed := b.probeRedis(ctx, secs(set.HandoffWindowS), &probe)
	if err := sleepCtx(ctx, secs(set.HandoffWindowS)); err != nil {
		return err
	}
	s.HandoffBase, _, err = b.handoffs(ctx)
	if err != nil {
		return err
	}
	win.end(s.HandoffBase, r.PIDs(), b.redisPID, nil)
	s.HandoffBase.Depth = depth()
	<-probed
	s.HandoffBase.RedisRTTP50, s.HandoffBase.RedisRTTP99 = probe.RedisRTTP50, probe.RedisRTTP99
	base.stop()
	b.logf("   handoffs with %d waiting: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms (%d, depth %d when read); %s",
		set.BaseWaiters, s.HandoffBase.P50, s.HandoffBase.P90, s.HandoffBase.P99, s.HandoffBase.Max, s.HandoffBase.Count, s.HandoffBase.Depth,
		s.HandoffBase.cpuLine())
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}

	// Every permit held, BaseWaiters queued: the shallow idle load.
	if err := b.resetCounters(ctx); err != nil {
		return err
	}
	hold, err := startLoad(ctx, holdConfig(r.Targets, permits, nil))
	if err != nil {
		return err
	}
	loads = append(loads, hold)
	if !waitFor(ctx, 10*time.Second, func() bool {
		st, err := b.mockStats(ctx)
		return err == nil && st.InFlight >= permits
	}) {
		return errors.New("the permits were not all taken within 10s")
	}
	few, err := startLoad(ctx, waitConfig(r.Targets, set.BaseWaiters, set.PromptBytes, 1000, nil))
	if err != nil {
		return err
	}
	loads = append(loads, few)
	if !waitFor(ctx, 30*time.Second, func() bool { return depth() >= int64(set.BaseWaiters) }) {
		return fmt.Errorf("only %d of %d base waiters queued", depth(), set.BaseWaiters)
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	if s.BaseCmdsPerS, s.BaseScriptsPerS, _, err = b.idleOver(ctx, secs(set.IdleWindowS)); err != nil {
		return err
	}
	if s.RSSBefore, err = rssSum(r.PIDs()); err != nil {
		return err
	}
	if s.RedisMemBefore, err = b.redisUsedMemory(ctx); err != nil {
		return err
	}
	b.logf("   %d waiting: Redis %.1f cmds/s idle (%.1f scripts/s), RSS %.1f MiB (3 nodes), Redis used_memory %.1f MiB",
		set.BaseWaiters, s.BaseCmdsPerS, s.BaseScriptsPerS, float64(s.RSSBefore)/(1<<20), float64(s.RedisMemBefore)/(1<<20))

	// The deep queue, from the client processes.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	perProc := set.RampRPS / float64(len(shares))
	for i, sh := range shares {
		cfg := waitConfig([]string{r.Targets[sh.Node]}, sh.Waiters, set.PromptBytes, perProc, nil)
		data, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		path := filepath.Join(env.Dir, fmt.Sprintf("scale-client-%d.json", i+1))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
		p, err := env.Procs.Start(fmt.Sprintf("scale-client-%d", i+1), self, "-scale-client", path)
		if err != nil {
			return err
		}
		clients = append(clients, p)
	}
	want := int64(set.Waiters + set.BaseWaiters)
	ramp := secs(float64(set.Waiters)/set.RampRPS + 90)
	start := time.Now()
	lastLog := start
	var stall error
	for last, lastMove := int64(-1), time.Now(); ; {
		d := depth()
		if d >= want {
			break
		}
		if d > last {
			last, lastMove = d, time.Now()
		}
		for _, p := range clients {
			if p.Exited() {
				stall = fmt.Errorf("client %s exited: %s", p.Name, tail(p.Log, 300))
			}
		}
		if stall == nil && time.Since(lastMove) > 20*time.Second {
			stall = fmt.Errorf("the queue stopped growing at %d for 20 s", d)
		}
		if stall == nil && time.Since(start) > ramp {
			stall = fmt.Errorf("only %d of %d queued within %s", d, want, ramp)
		}
		if stall != nil {
			break
		}
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			b.logf("   queueing: depth %d of %d after %.0f s", d, want, time.Since(start).Seconds())
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	if err := sleepCtx(ctx, 3*time.Second); err != nil { // settle: bodies read, goroutines parked
		return err
	}
	s.Queued = max(depth()-int64(set.BaseWaiters), 0)
	if stall != nil {
		s.Note = stall.Error()
		b.logf("   %v", stall)
	}
	b.logf("   %d waiting after %.0f s", s.Queued, time.Since(start).Seconds())
	if s.RSSAfter, err = rssSum(r.PIDs()); err != nil {
		return err
	}
	if s.RedisMemAfter, err = b.redisUsedMemory(ctx); err != nil {
		return err
	}
	if s.Queued > 0 {
		s.RSSPerWaiterKiB = round(float64(s.RSSAfter-s.RSSBefore)/1024/float64(s.Queued), 2)
		s.RedisPerWaiterKiB = round(float64(s.RedisMemAfter-s.RedisMemBefore)/1024/float64(s.Queued), 2)
	}
	if s.IdleCmdsPerS, s.IdleScriptsPerS, s.IdleCommands, err = b.idleOver(ctx, secs(set.IdleWindowS)); err != nil {
		return err
	}
	// Nobody may have got in while every permit was held.
	for _, p := range clients {
		c, _ := readCounters(p)
		s.Served += c.Granted
		s.Failed += c.Failed
		s.Rejected += c.Rejected
		s.Dropped += c.Dropped
	}
	fc := few.r.Counters()
	s.Served += fc.Granted.Load()
	s.Failed += fc.Failed.Load()
	s.Rejected += fc.Rejected.Load()
	if st, err := b.mockStats(ctx); err == nil {
		s.UpstreamMaxHeld = st.MaxInFlight
	}
	b.logf("   %d waiting: RSS %.1f -> %.1f MiB = %.2f KiB per waiter; Redis %.1f -> %.1f MiB = %.2f KiB per waiter; Redis %.1f cmds/s idle (%.1f with %d); served %d, failed %d, rejected %d, dropped %d, upstream max %d",
		s.Queued, float64(s.RSSBefore)/(1<<20), float64(s.RSSAfter)/(1<<20), s.RSSPerWaiterKiB,
		float64(s.RedisMemBefore)/(1<<20), float64(s.RedisMemAfter)/(1<<20), s.RedisPerWaiterKiB,
		s.IdleCmdsPerS, s.BaseCmdsPerS, set.BaseWaiters, s.Served, s.Failed, s.Rejected, s.Dropped, s.UpstreamMaxHeld)

	// Release the permits: the queue drains, still deep.
	hold.stop()
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	if err := b.resetMock(ctx); err != nil {
		return err
	}
	win = startCPUWindow(r.PIDs(), b.redisPID, procPIDs(clients))
	probe = Handoffs{}
	probed = b.probeRedis(ctx, secs(set.HandoffWindowS), &probe)
	if err := sleepCtx(ctx, secs(set.HandoffWindowS)); err != nil {
		return err
	}
	s.HandoffDeep, s.UpstreamMaxFlow, err = b.handoffs(ctx)
	if err != nil {
		return err
	}
	win.end(s.HandoffDeep, r.PIDs(), b.redisPID, procPIDs(clients))
	s.HandoffDeep.Depth = depth()
	<-probed
	s.HandoffDeep.RedisRTTP50, s.HandoffDeep.RedisRTTP99 = probe.RedisRTTP50, probe.RedisRTTP99
	b.logf("   handoffs with %d waiting: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms (%d, depth %d when read), upstream max %d; %s",
		s.Queued, s.HandoffDeep.P50, s.HandoffDeep.P90, s.HandoffDeep.P99, s.HandoffDeep.Max, s.HandoffDeep.Count, s.HandoffDeep.Depth, s.UpstreamMaxFlow,
		s.HandoffDeep.cpuLine())
	return nil
}

// genericError drops the addresses and numbers of an error message, so
// that the same error from many connections counts as one:
// "dial tcp 127.0.0.1:4711: i/o timeout" -> "dial tcp N.N.N.N:N: i/o timeout".
func genericError(msg string) string {
	var b strings.Builder
	digits := false
	for _, r := range msg {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}

// cpuLine describes the CPU over a handoff window.
func (h *Handoffs) cpuLine() string {
	line := fmt.Sprintf("machine %.0f%% busy, Caddy %.2f cores, Redis %.2f", 100*h.MachineBusy, h.CaddyCores, h.RedisCores)
	if h.ClientCores > 0 {
		line += fmt.Sprintf(", clients %.2f", h.ClientCores)
	}
	if h.RedisRTTP99 > 0 {
		line += fmt.Sprintf("; Redis round trip p50 %.3f ms, p99 %.3f ms", h.RedisRTTP50, h.RedisRTTP99)
	}
	return line
}

// readCounters reads the last counters a client process printed.
func readCounters(p *Proc) (clientCounters, bool) {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return clientCounters{}, false
	}
	return parseLastCounters(data)
}

// scaleQueues measures set.Queues queues on one node and one Redis, the
// handler naming its queue from the X-Queue header.
func (b *bench) scaleQueues(ctx context.Context, env *Env, set ScaleSettings) (*ScaleQueues, error) {
	q := &ScaleQueues{}
	spec := Spec{Name: "fq-queues", Label: "fair_queue Redis, queue per header", Kind: KindFairQueue, Nodes: 1, Redis: true}
	qenv := *env
	qenv.Permits = set.QueuePermits
	r, err := startNodes(ctx, &qenv, spec, "{http.request.header.X-Queue}")
	if err != nil {
		return q, err
	}
	var loads []*background
	defer func() {
		var wg sync.WaitGroup
		for _, bg := range loads {
			wg.Go(bg.stop)
		}
		wg.Wait()
		env.Stop(r)
	}()
	name := func(i int) string { return fmt.Sprintf("scale-q%03d", i) }
	// Let Redis free what the deep queue's teardown left (client buffers).
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return q, err
	}
	mem0, err := b.redisUsedMemory(ctx)
	if err != nil {
		return q, err
	}
	// Warm on the first queue: every name opens a queue, and a handler
	// opens at most 100.
	if _, err := b.load(ctx, r.Targets, loadgen.Config{Clients: 4, Duration: 300 * time.Millisecond, Tokens: 1, Delay: time.Millisecond,
		Header: map[string][]string{"X-Queue": {name(0)}}}); err != nil {
		return q, err
	}
	if err := b.resetCounters(ctx); err != nil {
		return q, err
	}
	var waiting []*background
	open := func(from, to int) error {
		for i := from; i < to; i++ {
			h := map[string]string{"X-Queue": name(i)}
			hold, err := startLoad(ctx, holdConfig(r.Targets, set.QueuePermits, h))
			if err != nil {
				return err
			}
			loads = append(loads, hold)
		}
		if !waitFor(ctx, 30*time.Second, func() bool {
			st, err := b.mockStats(ctx)
			return err == nil && st.InFlight >= to*set.QueuePermits
		}) {
			return fmt.Errorf("the permits of %d queues were not all taken within 30s", to)
		}
		for i := from; i < to; i++ {
			h := map[string]string{"X-Queue": name(i)}
			w, err := startLoad(ctx, waitConfig(r.Targets, set.QueueWaiters, set.PromptBytes, 100, h))
			if err != nil {
				return err
			}
			loads = append(loads, w)
			waiting = append(waiting, w)
		}
		total := func() int64 {
			var n int64
			for i := range to {
				n += max(b.queueDepth(ctx, name(i)), 0)
			}
			return n
		}
		if !waitFor(ctx, 30*time.Second, func() bool { return total() >= int64(to*set.QueueWaiters) }) {
			return fmt.Errorf("only %d of %d waiters queued in %d queues", total(), to*set.QueueWaiters, to)
		}
		q.Waiting = total()
		return sleepCtx(ctx, time.Second)
	}
	if err := open(0, 1); err != nil {
		return q, err
	}
	if q.OneCmdsPerS, _, _, err = b.idleOver(ctx, secs(set.IdleWindowS)); err != nil {
		return q, err
	}
	mem, err := b.redisUsedMemory(ctx)
	if err != nil {
		return q, err
	}
	q.OneMem = mem - mem0
	q.RSSOne, _ = RSS(r.PIDs()[0])
	q.Queues = 1
	b.logf("   1 queue (%d held, %d waiting): Redis %.1f cmds/s idle, +%.1f KiB used_memory",
		set.QueuePermits, set.QueueWaiters, q.OneCmdsPerS, float64(q.OneMem)/1024)
	if err := open(1, set.Queues); err != nil {
		return q, err
	}
	q.Queues = set.Queues
	if q.ManyCmdsPerS, _, q.ManyCommands, err = b.idleOver(ctx, secs(set.IdleWindowS)); err != nil {
		return q, err
	}
	if mem, err = b.redisUsedMemory(ctx); err != nil {
		return q, err
	}
	q.ManyMem = mem - mem0
	q.RSSMany, _ = RSS(r.PIDs()[0])
	for _, w := range waiting {
		c := w.r.Counters()
		q.Served += c.Granted.Load()
		q.Failed += c.Failed.Load()
		q.Rejected += c.Rejected.Load()
	}
	b.logf("   %d queues (%d held, %d waiting each; %d waiting): Redis %.1f cmds/s idle, +%.1f KiB used_memory, RSS %.1f -> %.1f MiB; served %d, failed %d, rejected %d",
		q.Queues, set.QueuePermits, set.QueueWaiters, q.Waiting, q.ManyCmdsPerS, float64(q.ManyMem)/1024,
		float64(q.RSSOne)/(1<<20), float64(q.RSSMany)/(1<<20), q.Served, q.Failed, q.Rejected)
	return q, nil
}
