package scale

// The scale scenario: tens of thousands of streams waiting across the 3
// Caddy nodes of one queue (Caddy RSS and Redis memory per waiter, Redis
// commands per second while they wait, handoff latency with the queue
// that deep), and 100 queues on one Redis. The clients run in several
// processes (the bench binary re-executed with -scale-client): one
// process cannot hold 50,000 connections under the open-file limit.

import (
	"fmt"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
)

// planClients splits total waiters over procs processes, process i
// talking to node i%nodes, the counts differing by at most one. It fails
// when a process or a node would need more than perProc connections
// (the open-file limit less a reserve): a node's Caddy holds every
// waiter sent to it.
func planClients(total, nodes, procs, perProc int) ([]report.ClientShare, error) {
	if total < 0 || nodes <= 0 || procs <= 0 || procs%nodes != 0 {
		return nil, fmt.Errorf("cannot split %d waiters over %d processes and %d nodes", total, procs, nodes)
	}
	shares := make([]report.ClientShare, procs)
	perNode := make([]int, nodes)
	for i := range shares {
		n := total / procs
		if i < total%procs {
			n++
		}
		shares[i] = report.ClientShare{Node: i % nodes, Waiters: n}
		perNode[i%nodes] += n
		if n > perProc {
			return nil, fmt.Errorf("client process %d would hold %d connections, over %d", i, n, perProc)
		}
	}
	for node, n := range perNode {
		if n > perProc {
			return nil, fmt.Errorf("node %d would hold %d connections, over %d", node, n, perProc)
		}
	}
	return shares, nil
}
