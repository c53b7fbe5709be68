package bench

// The scale scenario: tens of thousands of streams waiting across the 3
// Caddy nodes of one queue (Caddy procs.RSS and Redis memory per waiter, Redis
// commands per second while they wait, handoff latency with the queue
// that deep), and 100 queues on one Redis. The clients run in several
// processes (the bench binary re-executed with -scale-client): one
// process cannot hold 50,000 connections under the open-file limit.

import (
	"fmt"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
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
	IdleCommands procs.CommandStats `json:"redis_idle_commands,omitempty"`
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
	ManyCommands procs.CommandStats `json:"redis_idle_commands_many,omitempty"`
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
