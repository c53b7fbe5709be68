package caddyfairqueue

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of capacity in tokens (Handler.KVTokens): the tokens held
// and the capacity of each queue that counts them, its estimator's
// bytes per token, and the requests clamped to the capacity; per pool
// upstream, its own (metrics_pool.go).

var (
	descKVCapacity = newStateDesc("kv_tokens_capacity",
		"KV-cache tokens the queue's running requests may hold at once, across the cluster (kv_tokens, or the sum of its upstreams'), as configured on this instance; absent when the queue does not count tokens.")
	descKVHeld = newStateDesc("kv_tokens_held",
		"KV-cache tokens held by the running requests of the whole queue (their weights: estimated prompt tokens plus completion budget), all instances, as the store reported at this instance's last heartbeat; absent when the queue does not count tokens. Reported like cluster_waiting.")
	descKVBudget = newStateDesc("kv_completion_budget",
		"The completion budget this instance learned for a queue's requests that set none (the 95th percentile of the tokens their last 256 answers generated); absent until 20 such answers are seen. default_max_tokens, where set, applies instead.")
	descKVBytesPerToken = newStateDesc("kv_bytes_per_token",
		"The bytes of prompt text per prompt token that this instance estimates a queue's prompts with, learned from the answers' usage (4 before the first). Present once the queue counts tokens or has learned.")
	descUpstreamKVCapacity = newUpstreamDesc("upstream_kv_tokens_capacity",
		"KV-cache tokens each upstream of the queue's pool may hold at once (its kv_tokens), as configured on this instance; absent for an upstream without kv_tokens.")
	descUpstreamKVHeld = newUpstreamDesc("upstream_kv_tokens_held",
		"KV-cache tokens held by the running requests on each upstream of the queue's pool, all instances, read from the store at each scrape like upstream_in_flight; absent for an upstream without kv_tokens.")
)

// observeClamped counts a request heavier than its queue's capacity.
func observeClamped(queue string) {
	initMetrics()
	metrics.kvClamped.WithLabelValues(queue).Inc()
}

// collectKV reports the token gauges of engines, by queue label:
// engines of one label on one data set are one queue (byQueue), whose
// capacity and the store's view count once (the largest, the freshest
// where they differ), and queues of one label add up, as in
// queueGauges; the estimate is that of the label's engine that learned
// from the most answers.
func collectKV(ch chan<- prometheus.Metric, engines []*engine) {
	type kv struct {
		counts         bool
		capacity, held int
		ratio          float64
		samples        int64
		heldKnown      bool
		budget         int64
		answers        int64
	}
	out := make(map[string]*kv)
	label := func(e *engine) string { return e.label(e.q.Config()) }
	groups := byQueue(engines, label)
	inForce := configured(groups, label)
	for i, group := range groups {
		g := out[label(group[0])]
		if g == nil {
			g = &kv{ratio: seedBytesPerToken}
			out[label(group[0])] = g
		}
		var capacity, held int
		var heldKnown bool
		for _, e := range group {
			cfg, st := e.q.Config(), e.q.Stats()
			if cfg.KVTokens > 0 {
				g.counts = true
				capacity = max(capacity, cfg.KVTokens)
				if st.StoreUp && st.Cluster.Nodes > 0 {
					held = max(held, st.Cluster.TokensHeld)
					heldKnown = true
				}
			}
			if ratio, n := e.kv.state(); n > g.samples {
				g.ratio, g.samples = ratio, n
			}
			if budget, n := e.budget.state(); budget > 0 && n > g.answers {
				g.budget, g.answers = budget, n
			}
		}
		if inForce[i] {
			g.capacity += capacity
		}
		g.held += held
		g.heldKnown = g.heldKnown || heldKnown
	}
	for label, g := range out {
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, label)
		}
		if g.counts || g.samples > 0 {
			gauge(descKVBytesPerToken, g.ratio)
		}
		if g.budget > 0 {
			gauge(descKVBudget, float64(g.budget))
		}
		if !g.counts {
			continue
		}
		gauge(descKVCapacity, float64(g.capacity))
		if g.heldKnown {
			gauge(descKVHeld, float64(g.held))
		}
	}
}
