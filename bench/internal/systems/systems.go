// Package systems starts the systems under test of a bench run: HAProxy,
// plain Caddy reverse_proxy and fair_queue nodes (local or Redis store,
// JSON or Caddyfile config) in front of the shared upstream, each
// described by a Spec and started on an Env.
package systems

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
)

// Kinds of system under test.
const (
	KindHAProxy   = "haproxy"
	KindPlain     = "plain"
	KindFairQueue = "fair_queue"
)

// Spec describes one system under test.
type Spec struct {
	// Name is short and unique: it names log files and the queue.
	Name string `json:"name"`
	// Label is how tables and plots show it.
	Label string `json:"label"`
	// Kind is one of the Kind constants.
	Kind string `json:"kind"`
	// Nodes is the number of Caddy processes, the load spread over them
	// round-robin.
	Nodes int `json:"nodes"`
	// Redis selects the Redis store; otherwise the in-process one.
	Redis bool `json:"redis"`
	// BaselineOnly: the system only runs the low load and the
	// unstreamed saturated load, as the reference of a fair_queue system
	// with as many nodes (the latency and the CPU a queue adds are
	// measured against the same topology without it).
	BaselineOnly bool `json:"baseline_only,omitempty"`
	// Tenant and Cost set fair_queue's tenant and cost (the fairness
	// scenario); empty: strict FIFO, the default cost.
	Tenant string `json:"tenant,omitempty"`
	Cost   string `json:"cost,omitempty"`
	// Caddyfile configures the Caddy nodes as an operator's Caddyfile
	// would (caddyConfigFile): admin endpoint on, default logging, default
	// reverse_proxy; otherwise the bench's JSON (caddyConfig: admin off,
	// warnings only).
	Caddyfile bool `json:"caddyfile,omitempty"`
}

// Limited reports whether the system holds the upstream to the permits.
func (s Spec) Limited() bool { return s.Kind != KindPlain }

// DefaultSpecs are the systems of a run, HAProxy first: it is the
// reference the others are compared with.
func DefaultSpecs() []Spec {
	return []Spec{
		{Name: "haproxy", Label: "HAProxy maxconn", Kind: KindHAProxy, Nodes: 1},
		{Name: "caddy", Label: "Caddy reverse_proxy", Kind: KindPlain, Nodes: 1},
		{Name: "caddy-3", Label: "Caddy reverse_proxy 3 nodes", Kind: KindPlain, Nodes: 3, BaselineOnly: true},
		{Name: "fq-local", Label: "fair_queue local", Kind: KindFairQueue, Nodes: 1},
		{Name: "fq-redis-1", Label: "fair_queue Redis 1 node", Kind: KindFairQueue, Nodes: 1, Redis: true},
		{Name: "fq-redis-3", Label: "fair_queue Redis 3 nodes", Kind: KindFairQueue, Nodes: 3, Redis: true},
	}
}

// Env is what every system of a run shares: the binaries, the upstream,
// Redis, and the owner of the processes.
type Env struct {
	// Caddy is the path of the Caddy binary with the plugin; HAProxy the
	// path of haproxy, empty when unavailable.
	Caddy   string
	HAProxy string
	// Dir receives configs and logs; Procs owns the processes.
	Dir   string
	Procs *procs.Procs
	// MockAddr and RedisAddr are the host:port of mockllm and Redis.
	MockAddr  string
	RedisAddr string
	// Permits and MaxWait configure every limiter.
	Permits int
	MaxWait time.Duration
	// Pool, when set, replaces MockAddr with these upstreams, Permits
	// each: HAProxy's servers, fair_queue's upstreams (reverse_proxy
	// then takes the granted one), plain reverse_proxy's upstreams.
	Pool []string
	// KVTokens, when set, is fair_queue's kv_tokens of each upstream, in
	// the order of upstreams(): the queue's with one, each pool
	// upstream's with several.
	KVTokens []int
	// AdaptiveTTFT, when set, makes fair_queue learn its capacity under
	// Permits (its `adaptive` block) with this target_ttft, reading the
	// upstreams' gauges (backend_metrics).
	AdaptiveTTFT time.Duration
	// DefaultMaxTokens, when set, is fair_queue's default_max_tokens: the
	// completion budget of a request that sets none, fixed (unset, the
	// queue learns it from the answers' usage).
	DefaultMaxTokens int
	// Status, when set, serves fair_queue_status at StatusPath on each
	// fair_queue node, so that the bench can read the queue's state (its
	// learned completion budget) as an operator would.
	Status bool
}

// StatusPath is where a node started with Env.Status serves
// fair_queue_status; ?format=json answers the queues' state.
const StatusPath = "/fair_queue/status"

// upstreams are the addresses of the upstream replicas.
func (e *Env) upstreams() []string {
	if len(e.Pool) > 0 {
		return e.Pool
	}
	return []string{e.MockAddr}
}

// Running is a started system.
type Running struct {
	// Spec is the system.
	Spec Spec
	// Targets are the base URLs, one per node.
	Targets []string
	// Queue is the fair_queue name (Redis keys {fair_queue:<Queue>}:...).
	Queue string
	procs []*procs.Proc
}

// PIDs returns the process ids of the system's nodes.
func (r *Running) PIDs() []int {
	pids := make([]int, len(r.procs))
	for i, p := range r.procs {
		pids[i] = p.PID()
	}
	return pids
}

// Port returns the port node i listens on.
func (r *Running) Port(i int) int {
	u := r.Targets[i]
	port, _ := strconv.Atoi(u[strings.LastIndexByte(u, ':')+1:])
	return port
}

// Start starts the nodes of spec and waits until they listen.
func (e *Env) Start(ctx context.Context, spec Spec) (*Running, error) {
	ports, err := procs.FreePorts(spec.Nodes)
	if err != nil {
		return nil, err
	}
	r := &Running{Spec: spec, Queue: "bench-" + spec.Name}
	for i, port := range ports {
		name := spec.Name
		if spec.Nodes > 1 {
			name += "-" + strconv.Itoa(i+1)
		}
		listen := "127.0.0.1:" + strconv.Itoa(port)
		p, err := e.startNode(name, listen, spec, r.Queue)
		if err != nil {
			e.Stop(r)
			return nil, err
		}
		r.procs = append(r.procs, p)
		if err := p.WaitListen(ctx, listen, 15*time.Second); err != nil {
			e.Stop(r)
			return nil, err
		}
		r.Targets = append(r.Targets, "http://"+listen)
	}
	return r, nil
}

// startNode writes the config of one node and starts it.
func (e *Env) startNode(name, listen string, spec Spec, queue string) (*procs.Proc, error) {
	if spec.Kind == KindHAProxy {
		if e.HAProxy == "" {
			return nil, fmt.Errorf("haproxy is not installed")
		}
		cfg := filepath.Join(e.Dir, name+".cfg")
		if err := os.WriteFile(cfg, []byte(e.haproxyConfig(listen)), 0o644); err != nil {
			return nil, err
		}
		return e.Procs.Start(name, e.HAProxy, "-db", "-f", cfg)
	}
	if spec.Caddyfile {
		ports, err := procs.FreePorts(1)
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(e.Dir, name+".caddyfile")
		data := e.caddyConfigFile(listen, "127.0.0.1:"+strconv.Itoa(ports[0]), spec, queue)
		if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
			return nil, err
		}
		return e.Procs.Start(name, e.Caddy, "run", "--config", cfg, "--adapter", "caddyfile")
	}
	data, err := e.caddyConfig(listen, spec, queue)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(e.Dir, name+".json")
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		return nil, err
	}
	return e.Procs.Start(name, e.Caddy, "run", "--config", cfg)
}

// Stop stops the nodes of r.
func (e *Env) Stop(r *Running) {
	for _, p := range r.procs {
		e.Procs.Stop(p)
	}
}

// haproxyConfig queues in HAProxy itself: at most Permits connections to
// the upstream, the others wait up to MaxWait ("timeout queue").
func (e *Env) haproxyConfig(listen string) string {
	return fmt.Sprintf(`global
	maxconn 9000

defaults
	mode http
	timeout connect 2s
	timeout client 15m
	timeout server 15m
	timeout queue %dms
	option http-keep-alive
	# forward each streamed chunk at once (no MSG_MORE batching), as SSE needs
	option http-no-delay

frontend fe
	bind %s
	default_backend be

backend be
%s`, e.MaxWait.Milliseconds(), listen, e.haproxyServers())
}

// haproxyServers are the backend's server lines, maxconn Permits each.
func (e *Env) haproxyServers() string {
	var b strings.Builder
	for i, addr := range e.upstreams() {
		fmt.Fprintf(&b, "\tserver s%d %s maxconn %d\n", i+1, addr, e.Permits)
	}
	return b.String()
}

// caddyConfig returns the JSON config of one Caddy node: reverse_proxy to
// mockllm, preceded by fair_queue unless spec is plain. Admin is off, logs
// only warnings.
func (e *Env) caddyConfig(listen string, spec Spec, queue string) ([]byte, error) {
	var handlers []any
	if spec.Kind == KindFairQueue {
		fq := map[string]any{
			"handler":  "fair_queue",
			"name":     queue,
			"permits":  e.Permits,
			"max_wait": e.MaxWait.String(),
			"max_body": 1 << 20,
			// The scale scenario's 50,000 waiters, about 17,000 a node,
			// count some 34 KiB each (the 32 KiB a waiting request holds,
			// its body and head): beyond the default 256 MiB.
			"max_waiting_bytes": 1 << 30,
		}
		if spec.Tenant != "" {
			fq["tenant"] = spec.Tenant
		}
		if spec.Cost != "" {
			fq["cost"] = spec.Cost
		}
		if spec.Redis {
			fq["redis"] = map[string]any{"url": "redis://" + e.RedisAddr + "/0"}
		}
		if len(e.Pool) > 0 {
			delete(fq, "permits") // the pool's sum
			var ups []any
			for i, addr := range e.Pool {
				u := map[string]any{"dial": addr, "permits": e.Permits}
				if i < len(e.KVTokens) {
					u["kv_tokens"] = e.KVTokens[i]
				}
				ups = append(ups, u)
			}
			fq["upstreams"] = ups
		} else if len(e.KVTokens) > 0 {
			fq["kv_tokens"] = e.KVTokens[0]
		}
		if e.DefaultMaxTokens > 0 {
			fq["default_max_tokens"] = e.DefaultMaxTokens
		}
		if e.AdaptiveTTFT > 0 {
			gauges := "http://" + e.MockAddr + "/metrics" // the backend's own gauges (vLLM's names)
			if len(e.Pool) > 0 {
				gauges = "/metrics" // on each upstream
			}
			fq["adaptive"] = map[string]any{"target_ttft": e.AdaptiveTTFT.String(), "interval": "250ms", "backend_metrics": gauges}
		}
		handlers = append(handlers, fq)
	}
	proxy := map[string]any{"handler": "reverse_proxy", "flush_interval": -1}
	if spec.Kind == KindFairQueue && len(e.Pool) > 0 {
		proxy["dynamic_upstreams"] = map[string]any{"source": "fair_queue"}
	} else {
		var ups []any
		for _, addr := range e.upstreams() {
			ups = append(ups, map[string]any{"dial": addr})
		}
		proxy["upstreams"] = ups
	}
	handlers = append(handlers, proxy)
	routes := []any{map[string]any{"handle": handlers}}
	if e.Status && spec.Kind == KindFairQueue {
		status := map[string]any{"match": []any{map[string]any{"path": []string{StatusPath}}},
			"handle": []any{map[string]any{"handler": "fair_queue_status"}}, "terminal": true}
		routes = append([]any{status}, routes...)
	}
	cfg := map[string]any{
		"admin": map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{
			"default": map[string]any{"level": "WARN"},
		}},
		"apps": map[string]any{"http": map[string]any{
			"grace_period": "1s",
			"servers": map[string]any{"bench": map[string]any{
				"listen":          []string{listen},
				"automatic_https": map[string]any{"disable": true},
				"routes":          routes,
			}},
		}},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// caddyConfigFile returns the Caddyfile of one node as an operator writes
// it (README's quick start): a site on the port (every interface) with fair_queue and
// reverse_proxy in a route, every other setting at its default (the
// admin endpoint on, at admin, logs at INFO to stderr). Only the config
// autosave is off, so that nodes do not share a file in $HOME. Plain
// nodes have no fair_queue.
func (e *Env) caddyConfigFile(listen, admin string, spec Spec, queue string) string {
	var fq string
	if spec.Kind == KindFairQueue {
		fq = fmt.Sprintf("\t\tfair_queue {\n\t\t\tname %s\n\t\t\tpermits %d\n\t\t\tmax_wait %s\n",
			queue, e.Permits, e.MaxWait)
		if spec.Redis {
			fq += "\t\t\tredis redis://" + e.RedisAddr + "/0\n"
		}
		fq += "\t\t}\n"
	}
	return fmt.Sprintf(`{
	admin %s
	persist_config off
}

%s {
	route {
%s		reverse_proxy %s
	}
}
`, admin, listen[strings.LastIndexByte(listen, ':'):], fq, e.MockAddr)
}

// StartNodes starts spec's nodes, queue naming fair_queue's queue (a
// placeholder for the many-queues run), on env (its own max_wait).
func StartNodes(ctx context.Context, env *Env, spec Spec, queue string) (*Running, error) {
	ports, err := procs.FreePorts(spec.Nodes)
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
