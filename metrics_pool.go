package caddyfairqueue

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Per-upstream metrics of a queue with a pool (Handler.Upstreams): the
// requeue and cooldown counters, and the gauges of each upstream of the
// pool. The label upstream is a dial address of the pool's config, never
// a value of a request, so its values are bounded by the config.

// observeRequeue counts a request that upstream answered with a
// requeue_on status (or failed to connect to), sent back into the queue.
// reason is the upstream's status code ("503"), "unreachable" or
// "stale_connection".
func observeRequeue(queue, upstream, reason string) {
	initMetrics()
	metrics.requeues.WithLabelValues(queue, upstream, reason).Inc()
}

// observeCooldown counts a cooldown of upstream asked by this instance.
func observeCooldown(queue, upstream string) {
	initMetrics()
	metrics.cooldowns.WithLabelValues(queue, upstream).Inc()
}

// The pool's state is the cluster's, which no heartbeat brings: the
// gauges read it from the store at the scrape (Inspect, one read-only
// script per queue with a pool, O(holders + nodes + waiting flows)),
// every queue at once, each within upstreamScrapeTimeout.
const (
	upstreamScrapeTimeout  = 500 * time.Millisecond
	upstreamScrapeParallel = 8
)

var (
	descUpstreamPermits = newUpstreamDesc("upstream_permits",
		"Permits of each upstream of the queue's pool (upstream: its dial address), as configured on this instance.")
	descUpstreamInFlight = newUpstreamDesc("upstream_in_flight",
		"Permits held on each upstream of the queue's pool, all instances, read from the store at each scrape; absent while the store cannot be read. Take max by queue and upstream.")
	descUpstreamCooling = newUpstreamDesc("upstream_cooling",
		"1 while the upstream is in a cooldown (left out of dispatch in the whole cluster after it failed a request), else 0; read from the store at each scrape like upstream_in_flight.")
)

func newUpstreamDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, name), help,
		[]string{"queue", "upstream"}, nil)
}

// upstreamGauges are one upstream's gauges under one queue label.
type upstreamGauges struct {
	permits, inFlight  int
	kvCapacity, kvHeld int // with kv_tokens on the upstream
	cooling            bool
	unread             bool // an engine of the label could not read its store: no in_flight, no cooling
}

// collectUpstreams reports the gauges of the configured upstreams of
// engines. Engines of one label on one data set are one queue
// (byQueue): each upstream's settings count once (the largest where
// they differ) and its store is read once, by its newest engine that
// reaches it. Queues of one label add up, as in queueGauges (but for
// the settings of one a reload retired: configured); an
// upstream the store knows but this instance's config does not list
// (another instance's, during a rolling change) is not reported.
func collectUpstreams(ch chan<- prometheus.Metric, engines []*engine) {
	type pool struct {
		label      string
		ups        []fairqueue.Upstream
		snap       *fairqueue.Snapshot // nil: not read
		configured bool                // its settings are in force (configured)
	}
	var pools []*pool
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), upstreamScrapeTimeout)
	defer cancel()
	sem := make(chan struct{}, upstreamScrapeParallel)
	label := func(e *engine) string { return e.label(e.q.Config()) }
	groups := byQueue(engines, label)
	inForce := configured(groups, label)
	for i, group := range groups {
		p := &pool{label: label(group[0]), configured: inForce[i]}
		var reader *engine
		for _, e := range group {
			cfg := e.q.Config()
			if len(cfg.Upstreams) == 0 {
				continue
			}
			p.ups = mergeUpstreams(p.ups, cfg.Upstreams)
			if e.q.Stats().StoreUp { // no point waiting for a store known down
				reader = e
			}
		}
		if len(p.ups) == 0 {
			continue
		}
		pools = append(pools, p)
		if reader == nil {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if snap, err := reader.q.Inspect(ctx, 0, 0); err == nil {
				p.snap = &snap
			}
		})
	}
	wg.Wait()

	type key struct{ queue, upstream string }
	out := make(map[key]*upstreamGauges)
	for _, p := range pools {
		state := make(map[string]fairqueue.UpstreamInfo)
		if p.snap != nil {
			for _, u := range p.snap.Upstreams {
				state[u.Dial] = u
			}
		}
		for _, u := range p.ups {
			k := key{p.label, u.Dial}
			g := out[k]
			if g == nil {
				g = new(upstreamGauges)
				out[k] = g
			}
			if p.configured {
				g.permits += u.Permits
				g.kvCapacity += u.KVTokens
			}
			if p.snap == nil {
				g.unread = true
				continue
			}
			g.inFlight += state[u.Dial].InFlight
			g.kvHeld += state[u.Dial].TokensHeld
			g.cooling = g.cooling || state[u.Dial].CoolLeft > 0
		}
	}
	for k, g := range out {
		gauge := func(d *prometheus.Desc, v int) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), k.queue, k.upstream)
		}
		gauge(descUpstreamPermits, g.permits)
		if g.kvCapacity > 0 {
			gauge(descUpstreamKVCapacity, g.kvCapacity)
		}
		if g.unread {
			continue
		}
		gauge(descUpstreamInFlight, g.inFlight)
		if g.kvCapacity > 0 {
			gauge(descUpstreamKVHeld, g.kvHeld)
		}
		cooling := 0
		if g.cooling {
			cooling = 1
		}
		gauge(descUpstreamCooling, cooling)
	}
}

// mergeUpstreams adds the upstreams of ups that pool lacks to it, and
// gives one it has the larger permits and kv_tokens of the two.
func mergeUpstreams(pool, ups []fairqueue.Upstream) []fairqueue.Upstream {
	for _, u := range ups {
		i := slices.IndexFunc(pool, func(p fairqueue.Upstream) bool { return p.Dial == u.Dial })
		if i < 0 {
			pool = append(pool, u)
			continue
		}
		pool[i].Permits = max(pool[i].Permits, u.Permits)
		pool[i].KVTokens = max(pool[i].KVTokens, u.KVTokens)
	}
	return pool
}
