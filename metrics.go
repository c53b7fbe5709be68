package caddyfairqueue

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are created once and registered in every config's registry
// (Caddy serves only the current config's), as reverse_proxy does.
var metrics = struct {
	once     sync.Once
	requests *prometheus.CounterVec
	wait     *prometheus.HistogramVec
}{}

func registerMetrics(reg *prometheus.Registry) {
	const ns, sub = "caddy", "fair_queue"
	labels := []string{"queue", "outcome"}
	metrics.once.Do(func() {
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns,
			Subsystem: sub,
			Name:      "requests_total",
			Help:      "Requests that went through the fair queue, by outcome: granted, fail_open (admitted without a permit while Redis was unreachable), cancelled (client left while waiting), or the reject reason.",
		}, labels)
		metrics.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns,
			Subsystem: sub,
			Name:      "wait_seconds",
			Help:      "Time requests spent waiting for a permit, by outcome.",
			Buckets:   []float64{.005, .025, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60},
		}, labels)
	})
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{metrics.requests, metrics.wait} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err)
		}
	}
}

func observe(queue, outcome string, waited time.Duration) {
	metrics.requests.WithLabelValues(queue, outcome).Inc()
	metrics.wait.WithLabelValues(queue, outcome).Observe(waited.Seconds())
}
