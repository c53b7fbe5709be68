package integration

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"time"
)

// reloadChaosConfig is one random config of a group's queue (always
// named llm): a static reverse_proxy to one replica, or a pool of
// replicas with `dynamic fair_queue`; a store; fairness options.
type reloadChaosConfig struct {
	permits int           // 0: none (a pool's permits are its upstreams' sum)
	static  int           // the replica of a static reverse_proxy; -1 with a pool
	pool    []int         // permits per replica in the pool; 0: not in it
	requeue bool          // requeue_on 503
	lease   time.Duration // lease
	prefix  string        // the Redis key_prefix; "" the local store
	tenant  bool          // tenant, by X-Tenant
	cost    string        // "" (requests) or a cost line's argument
	cap     int           // max_in_flight_per_tenant; 0 none
}

// reloadChaosLeases are the leases a config picks from: long enough that
// a heartbeat late on a loaded machine does not lose a permit (the queue
// would rightly grant it again).
var reloadChaosLeases = []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}

// randomReloadChaosConfig draws a config over replicas replicas (a pool,
// or where static allows, a static reverse_proxy to any of them), its
// store among prefixes ("" the local store).
func randomReloadChaosConfig(rng *rand.Rand, replicas int, prefixes []string, static bool) reloadChaosConfig {
	c := reloadChaosConfig{static: -1, lease: reloadChaosLeases[rng.Intn(len(reloadChaosLeases))],
		prefix: prefixes[rng.Intn(len(prefixes))]}
	switch {
	case static && rng.Intn(2) == 0:
		c.static, c.permits = rng.Intn(replicas), 1+rng.Intn(3)
	default:
		c.pool = make([]int, replicas)
		sum := 0
		for sum == 0 {
			for i := range c.pool {
				c.pool[i] = rng.Intn(3) // 0: not in the pool
				sum += c.pool[i]
			}
		}
		if rng.Intn(3) == 0 {
			c.permits = 1 + rng.Intn(sum)
		}
		c.requeue = rng.Intn(2) == 0
	}
	if rng.Intn(2) == 0 {
		c.tenant = true
		c.cost = []string{"", "time", "tokens 4096", "max_tokens 64"}[rng.Intn(4)]
		c.cap = rng.Intn(3)
	}
	return c
}

// limit is the most requests the config lets replica i run at once.
func (c reloadChaosConfig) limit(i int) int {
	switch {
	case c.pool == nil && i == c.static:
		return c.permits
	case c.pool == nil:
		return 0
	case c.permits > 0:
		return min(c.pool[i], c.permits)
	default:
		return c.pool[i]
	}
}

// String is the config in short, for logs.
func (c reloadChaosConfig) String() string {
	var b strings.Builder
	if c.pool == nil {
		fmt.Fprintf(&b, "static r%d permits %d", c.static, c.permits)
	} else {
		fmt.Fprintf(&b, "pool %v", c.pool)
		if c.permits > 0 {
			fmt.Fprintf(&b, " permits %d", c.permits)
		}
		if c.requeue {
			b.WriteString(" requeue_on 503")
		}
	}
	fmt.Fprintf(&b, " lease %v", c.lease)
	if c.prefix == "" {
		b.WriteString(" local")
	} else {
		b.WriteString(" redis " + c.prefix)
	}
	if c.tenant {
		b.WriteString(" tenant")
		if c.cost != "" {
			b.WriteString(" cost " + c.cost)
		}
		if c.cap > 0 {
			fmt.Fprintf(&b, " max_in_flight_per_tenant %d", c.cap)
		}
	}
	return b.String()
}

// site is the config's site block over replicas, with Redis at
// redisAddr.
func (c reloadChaosConfig) site(replicas []*watchedReplica, redisAddr string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tfair_queue {\n\t\tname %s\n\t\tmax_wait %s\n\t\tlease %s\n", reloadChaosQueue, reloadChaosMaxWait, c.lease)
	line := func(format string, args ...any) { fmt.Fprintf(&b, "\t\t"+format+"\n", args...) }
	if c.permits > 0 {
		line("permits %d", c.permits)
	}
	for i, n := range c.pool {
		if n > 0 {
			line("upstream %s %d", replicas[i].addr, n)
		}
	}
	if c.requeue {
		line("requeue_on 503")
	}
	if c.tenant {
		line("tenant {http.request.header.X-Tenant}")
		if c.cost != "" {
			line("cost %s", c.cost)
		}
		if c.cap > 0 {
			line("max_in_flight_per_tenant %d", c.cap)
		}
	}
	if c.prefix != "" {
		// fail_closed: a store call that times out on a loaded machine
		// is a documented reject, not a request let through unlimited.
		line("redis {\n\t\t\turl redis://%s/0\n\t\t\tkey_prefix %s\n\t\t}", redisAddr, c.prefix)
		line("on_store_error fail_closed")
	}
	b.WriteString("\t}\n")
	if c.pool == nil {
		return b.String() + fmt.Sprintf("\treverse_proxy %s {\n\t\tflush_interval -1\n\t}", replicas[c.static].addr)
	}
	return b.String() + "\treverse_proxy {\n\t\tdynamic fair_queue\n\t\tflush_interval -1\n\t}"
}

// reloadChaosEpoch is a config of a group and when it came: the driver
// began loading it at from, and every instance of the group had it at
// applied.
type reloadChaosEpoch struct {
	cfg           reloadChaosConfig
	from, applied time.Time
}

// allowed is the most requests replica i may run when a request arrives
// at: the highest limit of replica i among the configs in force at some
// moment of the window before at, and the configs in force at those
// moments. A config is in force from the start of its load until every
// instance has the next one, and its settings a little longer (old
// holders run on): window covers that. Where a reload cannot hand the
// queue on at once (another store, whose queue takes the old one's
// waiters with the new config's first request; more permits on a route
// it moved), the old config's settings and routes serve its waiters
// until every instance has served a request of a later config: served
// says when that was (zero: never). A config whose successor moved the
// queue to another store (storeGrace > 0) keeps its settings longer:
// its queue, retired, serves the waiters it has with them, up to
// storeGrace (max_wait) after.
func allowed(epochs []reloadChaosEpoch, i int, at time.Time, window, storeGrace time.Duration,
	served func(after time.Time) time.Time) (int, []int) {
	most, in := 0, []int(nil)
	for k, e := range epochs {
		if e.from.After(at) {
			break
		}
		if k+1 < len(epochs) {
			end := epochs[k+1].applied
			if s := served(end); s.IsZero() {
				end = at
			} else if s.After(end) {
				end = s
			}
			until := end.Add(window)
			if epochs[k+1].cfg.prefix != e.cfg.prefix {
				until = until.Add(storeGrace)
			}
			if until.Before(at) {
				continue
			}
		}
		most = max(most, e.cfg.limit(i))
		in = append(in, k)
	}
	return most, slices.Clip(in)
}
