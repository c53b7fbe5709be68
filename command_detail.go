package caddyfairqueue

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// inForce is n of a capacity whose learned share is share (adaptive), as
// the store grants under it: n where no share applies (0, or at 1),
// else n x share rounded down, at least 1.
func inForce(n int, share float64) int {
	if n <= 0 || !(share > 0) || share >= 1 {
		return n
	}
	return max(int(math.Floor(float64(n)*share)), 1)
}

// learned reports whether share is a learned share below the ceiling.
func learned(share float64) bool { return share > 0 && share < 1 }

// printLearnedCapacity writes the capacity adaptive holds in force for a
// queue without a pool, when its learned share is below the ceiling:
// the table's PERMITS is the configured ceiling.
func printLearnedCapacity(w io.Writer, q queueReport) {
	share := q.Snapshot.LearnedShare
	if !learned(share) || len(q.Snapshot.Upstreams) > 0 {
		return
	}
	var parts []string
	if q.Permits > 0 && q.Permits < fairqueue.MaxPermits {
		parts = append(parts, fmt.Sprintf("%d of %d permits", inForce(q.Permits, share), q.Permits))
	}
	if q.KV != nil && q.KV.Capacity > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d kv tokens", inForce(q.KV.Capacity, share), q.KV.Capacity))
	}
	if len(parts) == 0 {
		fmt.Fprintf(w, "  capacity in force (adaptive): share %s of the configured\n", shareText(share))
		return
	}
	fmt.Fprintf(w, "  capacity in force (adaptive): %s (share %s)\n", strings.Join(parts, ", "), shareText(share))
}

// printUpstreams writes a pool's upstreams: each one's permits (with
// adaptive, those in force of those configured; "-" where unknown, as
// reading Redis directly), its permits in flight across the cluster, its
// tokens held (of its kv_tokens in force, where any upstream counts
// them) and whether it is in dispatch or cooling.
func printUpstreams(w io.Writer, ups []upstreamJSON) error {
	if len(ups) == 0 {
		return nil
	}
	tokens := false
	for _, u := range ups {
		tokens = tokens || u.KVTokens > 0 || u.TokensHeld != nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if tokens {
		fmt.Fprintln(tw, "  UPSTREAM\tPERMITS\tIN FLIGHT\tKV TOKENS\tSTATE")
	} else {
		fmt.Fprintln(tw, "  UPSTREAM\tPERMITS\tIN FLIGHT\tSTATE")
	}
	for _, u := range ups {
		permits := "-"
		if u.Permits > 0 {
			permits = strconv.Itoa(u.Permits)
			if learned(u.LearnedShare) {
				permits = fmt.Sprintf("%d of %d", inForce(u.Permits, u.LearnedShare), u.Permits)
			}
		}
		state := "in dispatch"
		if u.CoolLeftMS > 0 {
			state = "cooling " + (time.Duration(u.CoolLeftMS) * time.Millisecond).Round(100*time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t", termCell(u.Dial), permits, u.InFlight)
		if tokens {
			held := 0
			if u.TokensHeld != nil {
				held = *u.TokensHeld
			}
			cell := strconv.Itoa(held)
			if u.KVTokens > 0 {
				cell = fmt.Sprintf("%d of %d", held, inForce(u.KVTokens, u.LearnedShare))
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintf(tw, "%s\n", state)
	}
	return tw.Flush()
}

// shareText is a learned share as the admin API gives it, shortest.
func shareText(share float64) string { return strconv.FormatFloat(share, 'g', 3, 64) }
