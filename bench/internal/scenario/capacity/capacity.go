// Package capacity runs the capacity scenario: fixed permits in front of
// a GPU-shaped backend (mockllm -kv-tokens), the same drawn sequence of
// requests for the backend alone, HAProxy maxconn and a sweep of
// fair_queue permits. Its figures and their report are report.Capacity.
package capacity

// The capacity scenario: what a fixed permit count costs in front of a
// backend shaped like a GPU (mockllm -kv-tokens: one batch whose steps
// slow as it grows, a KV cache whose overflow preempts). A mixed workload
// of chats and long-context prompts arrives above what the backend
// serves, the same drawn sequence for every system: the backend alone
// (it queues what it cannot run itself), HAProxy maxconn, and fair_queue
// with a sweep of fixed permits. On one replica, then on a pool of two
// replicas of different KV sizes. Everything the scenario runs is in
// CapacitySettings: the later capacity rows (permits in tokens, learned
// capacity) are one more CapacityRow each.

import (
	"slices"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
)

// onlyCases keeps the topologies, workloads and rows named in names, from
// every one of a full run (rows: of the mode's); a kind none of whose
// names is named stays as it was.
func onlyCases(s report.CapacitySettings, names []string) report.CapacitySettings {
	all := report.DefaultCapacitySettings(false)
	var tops []report.CapacityTopology
	for _, t := range all.Topologies {
		if slices.Contains(names, t.Name) {
			tops = append(tops, t)
		}
	}
	var works []report.CapacityWorkload
	for _, w := range all.Workloads {
		if slices.Contains(names, w.Name) {
			works = append(works, w)
		}
	}
	if len(tops) > 0 {
		s.Topologies = tops
	}
	if len(works) > 0 {
		s.Workloads = works
	}
	keep := func(rows []report.CapacityRow) []report.CapacityRow {
		named := slices.DeleteFunc(slices.Clone(rows), func(r report.CapacityRow) bool { return !slices.Contains(names, r.Name) })
		if len(named) == 0 {
			return rows
		}
		return named
	}
	s.Rows, s.PoolRows = keep(s.Rows), keep(s.PoolRows)
	return s
}

// capacityRows returns the rows run in front of t.
func capacityRows(s report.CapacitySettings, t report.CapacityTopology) []report.CapacityRow {
	if len(t.Replicas) > 1 && len(s.PoolRows) > 0 {
		return s.PoolRows
	}
	return s.Rows
}
