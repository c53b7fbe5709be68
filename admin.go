package caddyfairqueue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// Admin API limits: how much of each queue a status shows, and how long
// reading one queue from its store may take.
const (
	adminHead         = 10
	adminFlows        = 10
	adminStoreTimeout = 2 * time.Second
	adminParallel     = 8 // queues read from their stores at once
)

// adminAPI is the admin.api.fair_queue module. Caddy loads every
// admin.api.* module it knows, so it needs no config: GET /fair_queue/
// on the admin endpoint lists the queues this instance serves, with
// their live state read from the store. It is read-only.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.fair_queue",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Provision registers the queue's metrics in the registry of the admin
// endpoint's config. Caddy starts a new admin endpoint, serving /metrics
// from the new config's registry, before it provisions the new config's
// apps; registered only by the handlers, the queue's series would be
// gone from /metrics after a load that fails later (a POST /load that
// does not validate), while the queues of the config in force still run.
func (*adminAPI) Provision(ctx caddy.Context) error {
	registerMetrics(ctx.GetMetricsRegistry())
	return nil
}

// Routes returns the /fair_queue/ route.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/fair_queue/", Handler: caddy.AdminHandlerFunc(a.serveStatus)}}
}

func (adminAPI) serveStatus(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	if r.URL.Path != "/fair_queue/" {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such resource: %s", r.URL.Path)}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(queueStatus(r.Context()))
}

// statusReport is the body of GET /fair_queue/; the CLI reads it.
type statusReport struct {
	Queues []queueReport `json:"queues"`
}

// queueReport is one queue as this instance sees it.
type queueReport struct {
	Name      string `json:"name"`
	storeDesc        // store, mode, address, master, db, key_prefix
	Permits   int    `json:"permits"`        // 0 when unknown (the CLI reading Redis directly)
	MaxWaitMS int64  `json:"max_wait_ms"`    // configured max wait
	LeaseMS   int64  `json:"lease_ms"`       // configured lease
	Node      string `json:"node,omitempty"` // this instance's node ID in the queue
	// Stats is this instance's view; Cluster the whole queue's as of this
	// instance's last heartbeat (absent before it). Both are omitted by
	// the CLI reading Redis directly.
	Stats    *nodeReport    `json:"stats,omitempty"`
	Cluster  *clusterReport `json:"cluster,omitempty"`
	Snapshot *snapshotJSON  `json:"snapshot,omitempty"` // live, from the store
	Error    string         `json:"error,omitempty"`    // why Snapshot is missing
	// KV is the queue's capacity in tokens and its prompt estimate; absent
	// while the queue counts no tokens and has learned nothing.
	KV *kvReport `json:"kv,omitempty"`
}

// kvReport is a queue's capacity in KV-cache tokens (kv_tokens) and this
// instance's estimate of its prompts' tokens.
type kvReport struct {
	// BytesPerToken is the bytes of prompt text per prompt token this
	// instance estimates the queue's prompts with (4 before the first
	// answer); Samples the answers it learned that from.
	BytesPerToken float64 `json:"bytes_per_token"`
	Samples       int64   `json:"samples"`
	// Capacity is the tokens the queue's running requests may hold, all
	// instances (0: tokens are not counted).
	Capacity int `json:"capacity"`
	// TokensHeld is what they hold, all instances: read from the store
	// with this answer when the snapshot could be, else as of this
	// instance's last heartbeat.
	TokensHeld int `json:"tokens_held"`
	// NodeTokensHeld is what this instance's running requests hold.
	NodeTokensHeld int64 `json:"node_tokens_held"`
	// CompletionBudget is the completion budget this instance learned
	// for the queue's requests that set none (0 until 20 such answers
	// are seen; default_max_tokens, where set, applies instead);
	// CompletionSamples the answers it learned that from.
	CompletionBudget  int64 `json:"completion_budget"`
	CompletionSamples int64 `json:"completion_samples"`
}

// nodeReport is fairqueue.Stats in the API, but for Grants: the
// permits granted to this instance's requests, as grants_total counts
// them (fail-open admissions excluded), not the queue's counter that
// fairqueue.Stats.Grants is (the snapshot's grants).
type nodeReport struct {
	Waiting  int   `json:"waiting"`
	InFlight int   `json:"in_flight"`
	StoreUp  bool  `json:"store_up"`
	Grants   int64 `json:"grants"`
	// StoreRefused: while Redis refuses this instance's user a
	// permission (NOPERM), the refusal and the ACL the user needs.
	StoreRefused string `json:"store_refused,omitempty"`
}

// clusterReport is the whole queue, all instances: read from the store
// with this answer (age_ms 0) when the snapshot could be, else as the
// store reported it at this instance's last heartbeat, age_ms ago.
type clusterReport struct {
	Waiting  int   `json:"waiting"`
	InFlight int   `json:"in_flight"`
	Nodes    int   `json:"nodes"` // live instances of the queue
	AgeMS    int64 `json:"age_ms"`
}

// snapshotJSON is fairqueue.Snapshot with durations in milliseconds.
type snapshotJSON struct {
	Waiting int                  `json:"waiting"`
	Head    []string             `json:"head"`
	Holders []holderJSON         `json:"holders"`
	Nodes   []nodeJSON           `json:"nodes"`
	Flows   []fairqueue.FlowInfo `json:"flows"`
	Grants  int64                `json:"grants"`
	// TokensHeld is the KV-cache tokens the holders hold: present when
	// the queue counts tokens (kv_tokens), 0 while nothing runs, or when
	// the store shows some held (the CLI reading Redis directly).
	TokensHeld *int `json:"tokens_held,omitempty"`
	// LearnedShare is the share of the configured capacity in force with
	// adaptive (absent until one is learned; with a pool, each upstream's).
	LearnedShare float64 `json:"learned_share,omitempty"`
	// Upstreams: with a pool, each upstream's permits (this instance's
	// config), permits held across the cluster, and cooldown left.
	Upstreams []upstreamJSON `json:"upstreams,omitempty"`
}

type upstreamJSON struct {
	Dial       string `json:"dial"`
	Permits    int    `json:"permits"`
	InFlight   int    `json:"in_flight"`
	CoolLeftMS int64  `json:"cool_left_ms"`        // 0: in dispatch
	KVTokens   int    `json:"kv_tokens,omitempty"` // its capacity in tokens (this instance's config)
	// TokensHeld is the tokens held on it: present when it has kv_tokens
	// (0 while nothing runs), or when the store shows some held.
	TokensHeld *int `json:"tokens_held,omitempty"`
	// LearnedShare is its share of its capacity in force with adaptive.
	LearnedShare float64 `json:"learned_share,omitempty"`
}

type holderJSON struct {
	Ticket      string `json:"ticket"`
	Node        string `json:"node"`
	LeaseLeftMS int64  `json:"lease_left_ms"`
	Tokens      int    `json:"tokens,omitempty"` // its weight in KV-cache tokens
}

type nodeJSON struct {
	ID          string `json:"id"`
	Alive       bool   `json:"alive"`
	ExpiresInMS int64  `json:"expires_in_ms"` // negative: dead that long
}

// snapshotReport is s for the admin API; pool is the configured
// upstreams in their order (nil: unknown, as for the CLI reading Redis
// directly: the store's upstreams are listed with permits 0).
func snapshotReport(s fairqueue.Snapshot, pool []fairqueue.Upstream) *snapshotJSON {
	out := &snapshotJSON{Waiting: s.Waiting, Head: s.Head, Flows: s.Flows, Grants: s.Grants, TokensHeld: shown(s.TokensHeld, false),
		LearnedShare: s.LearnedShare, Holders: []holderJSON{}, Nodes: []nodeJSON{}}
	if pool == nil {
		for _, u := range s.Upstreams {
			pool = append(pool, fairqueue.Upstream{Dial: u.Dial})
		}
	}
	for _, u := range pool {
		i := slices.IndexFunc(s.Upstreams, func(st fairqueue.UpstreamInfo) bool { return st.Dial == u.Dial })
		j := upstreamJSON{Dial: u.Dial, Permits: u.Permits, KVTokens: u.KVTokens}
		if i >= 0 {
			j.InFlight, j.CoolLeftMS = s.Upstreams[i].InFlight, s.Upstreams[i].CoolLeft.Milliseconds()
			j.TokensHeld, j.LearnedShare = shown(s.Upstreams[i].TokensHeld, u.KVTokens > 0), s.Upstreams[i].LearnedShare
		} else {
			j.TokensHeld = shown(0, u.KVTokens > 0)
		}
		out.Upstreams = append(out.Upstreams, j)
	}
	if out.Head == nil {
		out.Head = []string{}
	}
	if out.Flows == nil {
		out.Flows = []fairqueue.FlowInfo{}
	}
	for _, h := range s.Holders {
		out.Holders = append(out.Holders, holderJSON{Ticket: h.Ticket, Node: h.Node, LeaseLeftMS: h.LeaseLeft.Milliseconds(), Tokens: h.Tokens})
	}
	for _, n := range s.Nodes {
		out.Nodes = append(out.Nodes, nodeJSON{ID: n.ID, Alive: n.Alive, ExpiresInMS: n.ExpiresIn.Milliseconds()})
	}
	// Stores return holders and nodes in no useful order: the holder
	// whose lease ends first, and live nodes, come first.
	slices.SortStableFunc(out.Holders, func(a, b holderJSON) int { return cmp.Compare(a.LeaseLeftMS, b.LeaseLeftMS) })
	slices.SortStableFunc(out.Nodes, func(a, b nodeJSON) int { return cmp.Compare(b.ExpiresInMS, a.ExpiresInMS) })
	return out
}

// shown is n for a field that is present when counted is set (the
// queue or upstream counts tokens) or n is not 0; nil leaves it out.
func shown(n int, counted bool) *int {
	if n == 0 && !counted {
		return nil
	}
	return &n
}

// queueStatus reports every live engine of the process, sorted by queue
// name and store, reading the stores in parallel.
func queueStatus(ctx context.Context) statusReport {
	groups := byQueue(openEngines(), func(e *engine) string { return e.name })
	out := statusReport{Queues: make([]queueReport, len(groups))}
	sem := make(chan struct{}, adminParallel)
	var wg sync.WaitGroup
	for i, group := range groups {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out.Queues[i] = reportQueue(ctx, group)
		})
	}
	wg.Wait()
	slices.SortFunc(out.Queues, func(a, b queueReport) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Store, b.Store), cmp.Compare(a.Address, b.Address),
			cmp.Compare(a.DB, b.DB), cmp.Compare(a.KeyPrefix, b.KeyPrefix))
	})
	return out
}

// reportQueue is one queue as this instance sees it: the newest of its
// engines reports it, with the requests of all of them (engines of one
// queue on the same data: two Redis clients of one Redis, or a retired
// engine whose requests still run beside the live one).
func reportQueue(ctx context.Context, group []*engine) queueReport {
	rep := group[len(group)-1].report(ctx)
	for _, e := range group[:len(group)-1] {
		st := e.q.Stats()
		rep.Stats.Waiting += st.Waiting
		rep.Stats.InFlight += st.InFlight
		rep.Stats.Grants += e.grants.Load()
		if rep.KV != nil {
			rep.KV.NodeTokensHeld += e.tokens.Load()
		}
	}
	return rep
}

// report is the engine's queue as this instance sees it, its snapshot
// read from the store.
func (e *engine) report(ctx context.Context) queueReport {
	q := e.q
	cfg, st := q.Config(), q.Stats()
	rep := queueReport{Name: e.name, storeDesc: e.store}
	rep.Permits = cfg.Permits
	rep.MaxWaitMS = cfg.MaxWait.Milliseconds()
	rep.LeaseMS = cfg.Lease.Milliseconds()
	rep.Node = q.Node()
	rep.Stats = &nodeReport{Waiting: st.Waiting, InFlight: st.InFlight, StoreUp: st.StoreUp, Grants: e.grants.Load(), StoreRefused: st.StoreRefused}
	if st.Cluster.Nodes > 0 {
		rep.Cluster = &clusterReport{Waiting: st.Cluster.Waiting, InFlight: st.Cluster.Holders, Nodes: st.Cluster.Nodes,
			AgeMS: time.Since(st.Cluster.At).Milliseconds()}
	}
	rep.KV = e.kvReport(cfg, st.Cluster.TokensHeld)
	ictx, cancel := context.WithTimeout(ctx, adminStoreTimeout)
	defer cancel()
	snap, err := q.Inspect(ictx, adminHead, adminFlows)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	if rep.KV != nil {
		rep.KV.TokensHeld = snap.TokensHeld
	}
	rep.Snapshot = snapshotReport(snap, cfg.Upstreams)
	rep.Snapshot.TokensHeld = shown(snap.TokensHeld, cfg.KVTokens > 0)
	// Only the learned shares in force: none without adaptive, and with a
	// pool each upstream's, not the queue's (one learned before a reload
	// turned adaptive off or added the pool stays in the store).
	if cfg.Adaptive == nil || len(cfg.Upstreams) > 0 {
		rep.Snapshot.LearnedShare = 0
	}
	if cfg.Adaptive == nil {
		for i := range rep.Snapshot.Upstreams {
			rep.Snapshot.Upstreams[i].LearnedShare = 0
		}
	}
	// The snapshot is the store now: the cluster view agrees with it.
	live := 0
	for _, n := range snap.Nodes {
		if n.Alive {
			live++
		}
	}
	rep.Cluster = &clusterReport{Waiting: snap.Waiting, InFlight: len(snap.Holders), Nodes: live}
	return rep
}

// kvReport is the engine's capacity in tokens and prompt estimate, held
// as of its last heartbeat; nil while it counts no tokens and has
// learned nothing.
func (e *engine) kvReport(cfg fairqueue.Config, held int) *kvReport {
	ratio, samples := e.kv.state()
	budget, answers := e.budget.state()
	if cfg.KVTokens <= 0 && samples == 0 && answers == 0 {
		return nil
	}
	return &kvReport{BytesPerToken: ratio, Samples: samples, Capacity: max(cfg.KVTokens, 0), TokensHeld: held,
		NodeTokensHeld: e.tokens.Load(), CompletionBudget: budget, CompletionSamples: answers}
}

// Interface guards
var (
	_ caddy.AdminRouter = adminAPI{}
	_ caddy.Module      = adminAPI{}
	_ caddy.Provisioner = (*adminAPI)(nil)
)
