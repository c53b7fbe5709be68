package caddyfairqueue

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Metrics. Caddy serves only the registry of the config in force
// (ctx.GetMetricsRegistry), so the collectors are created once, as
// package globals, and registered in every config's registry, as
// reverse_proxy does: counters keep counting across reloads.
//
// Every metric has the label queue: the label the handler gives the
// queue's engine (newObserver), which the gauges read back from it, so
// that counters and gauges of a queue always agree. It is a name the
// handler opened (at most maxQueuesPerHandler of them, never one it
// refused) or overflowQueue. Besides, outcome and reason are fixed sets.
// No tenant.
//
// A gauge that exists both as this instance's view and as the cluster's
// says which in its name: node_waiting is this instance's waiters,
// cluster_waiting the whole queue's. Counters and histograms count what
// happened on this instance; sum them across instances.

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "fair_queue"
)

// Bucket bounds, in seconds. A handoff is one script and one Pub/Sub
// message: sub-millisecond on a LAN.
var (
	waitBuckets    = []float64{.005, .025, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}
	handoffBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	// firstByteBuckets span an LLM's time to first token: a cached or
	// short prompt in milliseconds, a long one or a busy server in
	// seconds to a minute.
	firstByteBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}
)

var metrics = struct {
	once        sync.Once
	requests    *prometheus.CounterVec
	wait        *prometheus.HistogramVec
	grants      *prometheus.CounterVec
	rejects     *prometheus.CounterVec
	handoff     *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	firstByte   *prometheus.HistogramVec
	requeues    *prometheus.CounterVec // metrics_pool.go
	cooldowns   *prometheus.CounterVec // metrics_pool.go
	kvClamped   *prometheus.CounterVec // metrics_kv.go
	state       stateCollector
}{}

func initMetrics() {
	metrics.once.Do(func() {
		counter := func(name, help string, labels ...string) *prometheus.CounterVec {
			return prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
			}, labels)
		}
		histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
			return prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help, Buckets: buckets,
			}, labels)
		}
		metrics.requests = counter("requests_total",
			"Requests that went through the fair queue on this instance, by outcome: granted, fail_open (admitted without a permit while the store was unreachable), cancelled (client left while waiting), or the reject reason.",
			"queue", "outcome")
		metrics.wait = histogram("wait_seconds",
			"Time requests spent waiting for a permit on this instance, by outcome.",
			waitBuckets, "queue", "outcome")
		metrics.grants = counter("grants_total",
			"Permits granted to requests of this instance, at once or after waiting (fail-open admissions excluded).",
			"queue")
		metrics.rejects = counter("rejects_total",
			"Requests of this instance that the queue refused a permit, by reason: timeout, queue_full, shutting_down, store_unavailable.",
			"queue", "reason")
		metrics.handoff = histogram("handoff_seconds",
			"Time from a permit's release anywhere in the cluster to the wake-up of the waiter of this instance it went to (store clock at the release, this instance's clock at the wake-up).",
			handoffBuckets, "queue")
		metrics.firstByte = histogram("upstream_first_byte_seconds",
			"Time from forwarding a granted request of this instance to the first byte of its answer's body (a stream's first event: the time to first token), by pool upstream (its dial address; empty without a pool). Answers held back (requeue_on) and errors relayed as events are not counted.",
			firstByteBuckets, "queue", "upstream")
		metrics.storeErrors = counter("store_errors_total",
			"Failed calls of this instance to the queue's store (Redis).",
			"queue")
		metrics.requeues = counter("requeues_total",
			"Requests of this instance that a pool upstream refused before any byte reached the client, sent back into the queue at their place, by upstream (its dial address) and reason: the upstream's requeue_on status code, unreachable, or stale_connection (a kept-alive connection it dropped before answering anything on it).",
			"queue", "upstream", "reason")
		metrics.cooldowns = counter("upstream_cooldowns_total",
			"Cooldowns of a pool upstream (its dial address) asked by this instance after the upstream failed a request; during one the upstream gets no grant anywhere in the cluster.",
			"queue", "upstream")
		metrics.kvClamped = counter("kv_clamped_total",
			"Requests of this instance heavier than the queue's kv_tokens (their estimated prompt tokens plus their completion budget), counted as the whole capacity: each runs alone.",
			"queue")
	})
}

// registerMetrics registers the package's collectors in reg, the
// registry of the config being provisioned; nil only creates them.
func registerMetrics(reg *prometheus.Registry) {
	initMetrics()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{
		metrics.requests, metrics.wait, metrics.grants, metrics.rejects,
		metrics.handoff, metrics.firstByte, metrics.storeErrors, metrics.requeues, metrics.cooldowns, metrics.kvClamped, metrics.state,
	} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err)
		}
	}
}

// observe counts a request's outcome; the handler calls it once per
// request it queued (or refused to queue).
func observe(queue, outcome string, waited time.Duration) {
	metrics.requests.WithLabelValues(queue, outcome).Inc()
	metrics.wait.WithLabelValues(queue, outcome).Observe(waited.Seconds())
}

// observeFirstByte counts an upstream's time to the first byte of an
// answer (firstByteWriter).
func observeFirstByte(queue, upstream string, d time.Duration) {
	initMetrics()
	metrics.firstByte.WithLabelValues(queue, upstream).Observe(d.Seconds())
}

// newObserver returns the fairqueue.Observer of a queue whose metrics
// are labelled queue: it counts the engine's grants, rejects, handoffs
// and store errors, and gives the gauges (stateCollector) their label.
// The children are resolved here, once per queue, so that the request
// path only adds to a counter.
func newObserver(queue string) fairqueue.Observer {
	initMetrics()
	l := prometheus.Labels{"queue": queue}
	o := &queueObserver{
		queue:       queue,
		grants:      metrics.grants.With(l),
		rejects:     make(map[fairqueue.Reason]prometheus.Counter, len(reasons)),
		other:       metrics.rejects.MustCurryWith(l),
		handoff:     metrics.handoff.With(l),
		storeErrors: metrics.storeErrors.With(l),
	}
	for _, r := range reasons { // every series from the first use, so that rate() sees the first reject
		o.rejects[r] = o.other.WithLabelValues(string(r))
	}
	return o
}

// queueObserver is the Observer of one queue.
type queueObserver struct {
	queue       string // the label
	grants      prometheus.Counter
	rejects     map[fairqueue.Reason]prometheus.Counter // read-only after newObserver
	other       *prometheus.CounterVec                  // rejects, curried: a reason newer than this file
	handoff     prometheus.Observer
	storeErrors prometheus.Counter
}

// Granted implements fairqueue.Observer.
func (o *queueObserver) Granted(time.Duration, bool) { o.grants.Inc() }

// Rejected implements fairqueue.Observer.
func (o *queueObserver) Rejected(r fairqueue.Reason, _ time.Duration) {
	if c, ok := o.rejects[r]; ok {
		c.Inc()
		return
	}
	o.other.WithLabelValues(string(r)).Inc()
}

// Handoff implements fairqueue.Observer.
func (o *queueObserver) Handoff(d time.Duration) { o.handoff.Observe(d.Seconds()) }

// StoreError implements fairqueue.Observer.
func (o *queueObserver) StoreError(error) { o.storeErrors.Inc() }

// The gauges, read from the live engines at each scrape.
var (
	descPermits = newStateDesc("permits",
		"Permits of the queue (its concurrency limit across the cluster), as configured on this instance.")
	descNodeWaiting = newStateDesc("node_waiting",
		"Requests of this instance waiting for a permit.")
	descNodeInFlight = newStateDesc("node_in_flight",
		"Permits held by requests of this instance (fail-open admissions included).")
	descStoreUp = newStateDesc("store_up",
		"1 while this instance reaches the queue's store; 0 from the first request answered by on_store_error because the store could not be dialled or joined, or once consecutive calls failed.")
	descClusterWaiting = newStateDesc("cluster_waiting",
		"Requests waiting in the whole queue, all instances, as the store reported at this instance's last heartbeat. Every instance that reaches the store reports it, idle or not (its heartbeats run every lease/3, so it is at most lease/3 old); take max by queue.")
	descClusterInFlight = newStateDesc("cluster_in_flight",
		"Permits held in the whole queue, all instances, as the store reported at this instance's last heartbeat. Reported like cluster_waiting.")
	descClusterLeaseExpirations = prometheus.NewDesc("caddy_fair_queue_cluster_lease_expirations_total",
		"Permits of the whole queue freed because their lease ended unrenewed (a crashed or partitioned instance), since the queue's state in the store began; as the store reported at this instance's last heartbeat. Reported like cluster_waiting.",
		[]string{"queue"}, nil)
	descClusterNodes = newStateDesc("cluster_nodes",
		"Live instances of the queue, as the store reported at this instance's last heartbeat. Reported like cluster_waiting.")
)

func newStateDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, name), help, []string{"queue"}, nil)
}

// stateCollector reports the gauges of every engine in the process at
// scrape time: engines outlive configs, and a gauge set by events would
// go stale when a queue closes.
type stateCollector struct {
	// engines lists the engines to report; nil: openEngines (tests
	// report queues of their own).
	engines func() []*engine
}

func (c stateCollector) live() []*engine {
	if c.engines != nil {
		return c.engines()
	}
	return openEngines()
}

// Describe implements prometheus.Collector.
func (stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPermits, descNodeWaiting, descNodeInFlight, descStoreUp,
		descClusterWaiting, descClusterInFlight, descClusterNodes, descClusterLeaseExpirations,
		descUpstreamPermits, descUpstreamInFlight, descUpstreamCooling,
		descKVCapacity, descKVHeld, descKVBytesPerToken, descKVBudget, descUpstreamKVCapacity, descUpstreamKVHeld, descCapacityShare, descUpstreamCapacityShare} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	live := c.live()
	for name, g := range queueGauges(live) {
		gauge := func(d *prometheus.Desc, v int) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), name)
		}
		gauge(descPermits, g.permits)
		gauge(descNodeWaiting, g.waiting)
		gauge(descNodeInFlight, g.inFlight)
		gauge(descStoreUp, g.storeUp)
		if g.clusterNodes > 0 {
			gauge(descClusterWaiting, g.clusterWaiting)
			gauge(descClusterInFlight, g.clusterInFlight)
			gauge(descClusterNodes, g.clusterNodes)
			ch <- prometheus.MustNewConstMetric(descClusterLeaseExpirations, prometheus.CounterValue, float64(g.leaseExpirations), name)
		}
	}
	collectKV(ch, live)
	collectAdaptive(ch, live)
	collectUpstreams(ch, live)
}

// gauges are one queue name's gauges.
type gauges struct {
	permits, waiting, inFlight, storeUp           int
	clusterWaiting, clusterInFlight, clusterNodes int
	leaseExpirations                              int64
}

// queueGauges reads the gauges of engines, by queue label. Engines of
// one label on one data set are one queue (byQueue): its permits and the
// store's view count once. Queues of one label (one name in different
// stores, or the queues of one handler labelled alike) add up, but for
// the permits of one a reload retired (configured), and store_up is 0
// if any of them is down.
func queueGauges(engines []*engine) map[string]*gauges {
	out := make(map[string]*gauges)
	label := func(e *engine) string { return e.label(e.q.Config()) }
	groups := byQueue(engines, label)
	inForce := configured(groups, label)
	for i, group := range groups {
		g := out[label(group[0])]
		if g == nil {
			g = &gauges{storeUp: 1}
			out[label(group[0])] = g
		}
		// One queue: its permits and the store's view once (the largest,
		// the freshest where they differ), each engine's own requests.
		var q gauges
		q.storeUp = 1
		for _, e := range group {
			cfg, st := e.q.Config(), e.q.Stats()
			q.permits = max(q.permits, cfg.Permits)
			q.waiting += st.Waiting
			q.inFlight += st.InFlight
			if !st.StoreUp {
				q.storeUp = 0
			}
			// Every node heartbeats, idle or not: its view is at most
			// lease/3 old.
			if st.StoreUp && st.Cluster.Nodes > 0 {
				q.clusterWaiting = max(q.clusterWaiting, st.Cluster.Waiting)
				q.clusterInFlight = max(q.clusterInFlight, st.Cluster.Holders)
				q.clusterNodes = max(q.clusterNodes, st.Cluster.Nodes)
				q.leaseExpirations = max(q.leaseExpirations, st.Cluster.LeaseExpirations)
			}
		}
		if inForce[i] {
			g.permits += q.permits
		}
		g.waiting += q.waiting
		g.inFlight += q.inFlight
		g.storeUp = min(g.storeUp, q.storeUp)
		g.clusterWaiting += q.clusterWaiting
		g.clusterInFlight += q.clusterInFlight
		g.clusterNodes += q.clusterNodes
		g.leaseExpirations = max(g.leaseExpirations, q.leaseExpirations)
	}
	return out
}

// configured reports, for each group of byQueue, whether its settings
// are this instance's configuration: not those of a queue a reload
// retired (every engine of the group retired) while a queue of its
// label is in force, the reload having moved it to another store. Its
// requests still count where they run (node_in_flight).
func configured(groups [][]*engine, label func(*engine) string) []bool {
	retired := func(group []*engine) bool {
		for _, e := range group {
			if !e.retiredFlag.Load() {
				return false
			}
		}
		return true
	}
	live := make(map[string]bool)
	for _, group := range groups {
		if !retired(group) {
			live[label(group[0])] = true
		}
	}
	out := make([]bool, len(groups))
	for i, group := range groups {
		out[i] = !retired(group) || !live[label(group[0])]
	}
	return out
}

// label is the queue label of e's metrics: its observer's (newObserver),
// or its name.
func (e *engine) label(cfg fairqueue.Config) string {
	o := cfg.Observer
	if m, ok := o.(engineObserver); ok {
		o = m.Observer
	}
	if o, ok := o.(*queueObserver); ok {
		return o.queue
	}
	return e.name
}

// Interface guards
var (
	_ fairqueue.Observer   = (*queueObserver)(nil)
	_ prometheus.Collector = stateCollector{}
)

// forgetQueue deletes the series of queue name, whose engine closed: a
// queue named from the request (perhaps a name a client made up) that
// went idle leaves no series behind.
func forgetQueue(name string) {
	initMetrics()
	match := prometheus.Labels{"queue": name}
	metrics.requests.DeletePartialMatch(match)
	metrics.wait.DeletePartialMatch(match)
	metrics.grants.DeletePartialMatch(match)
	metrics.rejects.DeletePartialMatch(match)
	metrics.handoff.DeletePartialMatch(match)
	metrics.firstByte.DeletePartialMatch(match)
	metrics.storeErrors.DeletePartialMatch(match)
	metrics.requeues.DeletePartialMatch(match)
	metrics.cooldowns.DeletePartialMatch(match)
	metrics.kvClamped.DeletePartialMatch(match)
}
