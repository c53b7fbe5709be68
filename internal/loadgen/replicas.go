package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

// Replica is one upstream whose concurrency a run watches: the URL of
// its mockllm GET /stats endpoint and the permits it must never exceed
// (0: not checked).
type Replica struct {
	Stats   string `json:"stats"`
	Permits int    `json:"permits,omitempty"`
}

// Name is the replica's host:port, taken from its stats URL (the URL
// itself when it has no host).
func (r Replica) Name() string {
	if u, err := url.Parse(r.Stats); err == nil && u.Host != "" {
		return u.Host
	}
	return r.Stats
}

// ParseReplicas reads loadgen's -upstream-stats and -permits flags: a
// comma-separated list of mockllm /stats URLs and, when permits is not
// empty, a comma-separated list of as many permit counts, the i-th for
// the i-th URL (0: that replica is not checked). A single URL with a
// single count is the one-upstream form. With no URL there is nothing
// to watch and permits is ignored.
func ParseReplicas(stats, permits string) ([]Replica, error) {
	if strings.TrimSpace(stats) == "" {
		return nil, nil
	}
	urls := strings.Split(stats, ",")
	reps := make([]Replica, len(urls))
	for i, u := range urls {
		u = strings.TrimSpace(u)
		if u == "" {
			return nil, fmt.Errorf("-upstream-stats %q: empty URL at position %d", stats, i+1)
		}
		reps[i].Stats = u
	}
	if strings.TrimSpace(permits) == "" {
		return reps, nil
	}
	counts := strings.Split(permits, ",")
	if len(counts) != len(reps) {
		return nil, fmt.Errorf("-permits %q: %d values for %d -upstream-stats URLs", permits, len(counts), len(reps))
	}
	for i, c := range counts {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-permits %q: %q is not a count of permits", permits, strings.TrimSpace(c))
		}
		reps[i].Permits = n
	}
	return reps, nil
}

// Over reports whether a replica ran more requests at once than its
// permits (never when its permits are not checked).
func (r Replica) Over(st UpstreamStats) bool {
	return r.Permits > 0 && st.MaxInFlight > r.Permits
}

// AnyOver reports whether any replica ran more requests at once than
// its permits; stats[i] is what replicas[i] reported.
func AnyOver(replicas []Replica, stats []UpstreamStats) bool {
	for i, r := range replicas {
		if i < len(stats) && r.Over(stats[i]) {
			return true
		}
	}
	return false
}

// WriteReplicaSummary prints each replica's highest concurrency against
// its permits and returns whether any ran above them. One replica keeps
// the one-line form "upstream: max concurrency 3 vs permits 4: ...";
// several get a line each.
func WriteReplicaSummary(w io.Writer, replicas []Replica, stats []UpstreamStats) (over bool) {
	verdict := func(r Replica, st UpstreamStats) string {
		if r.Permits <= 0 {
			return ""
		}
		v := "OK, never above the permits"
		if r.Over(st) {
			v = "OVER THE LIMIT"
		}
		return fmt.Sprintf(" vs permits %d: %s", r.Permits, v)
	}
	if len(replicas) == 1 {
		fmt.Fprintf(w, "upstream: max concurrency %d%s\n", stats[0].MaxInFlight, verdict(replicas[0], stats[0]))
		return AnyOver(replicas, stats)
	}
	width := 0
	for _, r := range replicas {
		width = max(width, len(r.Name()))
	}
	for i, r := range replicas {
		fmt.Fprintf(w, "replica %d %-*s  max concurrency %d%s\n", i+1, width, r.Name(), stats[i].MaxInFlight, verdict(r, stats[i]))
	}
	return AnyOver(replicas, stats)
}

// FetchReplicaStats reads every replica's /stats at once; errs[i] is
// the error of replicas[i], if any (its stats are then zero).
func FetchReplicaStats(ctx context.Context, hc *http.Client, replicas []Replica) (stats []UpstreamStats, errs []error) {
	stats = make([]UpstreamStats, len(replicas))
	errs = make([]error, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() { stats[i], errs[i] = FetchUpstreamStats(ctx, hc, r.Stats) })
	}
	wg.Wait()
	return stats, errs
}

// replicaLine is the progress line's part for several replicas:
// "replicas 1/1 2/2 3/3 (max 1 2 3)", each replica's requests in flight
// over its permits (alone when not checked), "?" when its stats could
// not be read.
func replicaLine(replicas []Replica, stats []UpstreamStats, errs []error) string {
	var now, hi strings.Builder
	for i, r := range replicas {
		if i > 0 {
			now.WriteByte(' ')
			hi.WriteByte(' ')
		}
		if errs[i] != nil {
			now.WriteByte('?')
			hi.WriteByte('?')
		} else {
			now.WriteString(strconv.Itoa(stats[i].InFlight))
			hi.WriteString(strconv.Itoa(stats[i].MaxInFlight))
		}
		if r.Permits > 0 {
			fmt.Fprintf(&now, "/%d", r.Permits)
		}
	}
	return "replicas " + now.String() + " (max " + hi.String() + ")"
}
