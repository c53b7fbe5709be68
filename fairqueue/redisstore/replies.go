package redisstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The scripts' replies, one decoder per script, each beside the shape it
// reads: a new field is one edit here and one in the script's reply.

// decodeAcquire reads acquire.lua's answer: {status, seq, grant no,
// position, grants, epoch, own grants}.
func decodeAcquire(v []any) (fairqueue.AcquireResult, any, error) {
	if len(v) != 7 {
		return fairqueue.AcquireResult{}, nil, fmt.Errorf("unexpected reply %v", v)
	}
	status, _ := v[0].(string)
	epoch, _ := v[5].(string)
	return fairqueue.AcquireResult{
		Granted:  status == "granted",
		Gone:     status == "gone",
		Full:     status == "full",
		Seq:      toInt(v[1]),
		GrantNo:  toInt(v[2]),
		Position: int(toInt(v[3])),
		Grants:   toInt(v[4]),
		Epoch:    epoch,
	}, v[6], nil
}

// decodeHeartbeat reads heartbeat.lua's answer: {epoch, rejoined,
// waiting, holders, nodes, expired, re-added, missing}.
func decodeHeartbeat(v []any) (fairqueue.HeartbeatResult, error) {
	if len(v) != 8 {
		return fairqueue.HeartbeatResult{}, fmt.Errorf("unexpected reply %v", v)
	}
	epoch, _ := v[0].(string)
	return fairqueue.HeartbeatResult{Epoch: epoch, Rejoined: toInt(v[1]) == 1,
		Cluster: fairqueue.ClusterView{Waiting: int(toInt(v[2])), Holders: int(toInt(v[3])), Nodes: int(toInt(v[4])),
			LeaseExpirations: toInt(v[5])},
		Readded: stringList(v[6]), Missing: stringList(v[7])}, nil
}

// decodeReconcile reads reconcile.lua's answer: {epoch, grants, waiting,
// holder tickets of the node, own grants}.
func decodeReconcile(v []any) (fairqueue.ReconcileResult, any, error) {
	if len(v) != 5 {
		return fairqueue.ReconcileResult{}, nil, fmt.Errorf("unexpected reply %v", v)
	}
	epoch, _ := v[0].(string)
	return fairqueue.ReconcileResult{Epoch: epoch, Grants: toInt(v[1]), Waiting: int(toInt(v[2])), Holders: stringList(v[3])}, v[4], nil
}

// decodeInspect reads inspect.lua's answer: {waiting, head tickets,
// {holder, ms left, ...}, {node, ms left, ...}, {flow, waiting, ...},
// grants}.
func decodeInspect(v []any) (fairqueue.Snapshot, error) {
	if len(v) != 6 {
		return fairqueue.Snapshot{}, fmt.Errorf("unexpected reply %v", v)
	}
	snap := fairqueue.Snapshot{Waiting: int(toInt(v[0])), Head: stringList(v[1]), Grants: toInt(v[5])}
	pairs(v[2], func(id string, ms int64) {
		snap.Holders = append(snap.Holders, fairqueue.Holder{Ticket: id, Node: fairqueue.TicketNode(id), LeaseLeft: time.Duration(ms) * time.Millisecond})
	})
	pairs(v[3], func(id string, ms int64) {
		snap.Nodes = append(snap.Nodes, fairqueue.NodeInfo{ID: id, Alive: ms >= 0, ExpiresIn: time.Duration(ms) * time.Millisecond})
	})
	for _, f := range asList(v[4]) {
		if f := asList(f); len(f) == 4 {
			name, _ := f[0].(string)
			usage, _ := f[3].(string)
			u, _ := strconv.ParseFloat(usage, 64)
			snap.Flows = append(snap.Flows, fairqueue.FlowInfo{Flow: name, Waiting: int(toInt(f[1])), Held: int(toInt(f[2])), Usage: u})
		}
	}
	return snap, nil
}

// parseGrant reads a grant message: "<ticket> <grant no> <Redis ms>".
func parseGrant(payload string) (fairqueue.Grant, bool) {
	f := strings.Fields(payload)
	if len(f) == 0 {
		return fairqueue.Grant{}, false
	}
	g := fairqueue.Grant{Ticket: f[0]}
	if len(f) > 1 {
		g.No, _ = strconv.ParseInt(f[1], 10, 64)
	}
	if len(f) > 2 {
		if ms, err := strconv.ParseInt(f[2], 10, 64); err == nil {
			g.At = time.UnixMilli(ms)
		}
	}
	return g, true
}

// stringList reads a script's list of strings.
func stringList(v any) []string {
	var out []string
	for _, x := range asList(v) {
		if id, ok := x.(string); ok {
			out = append(out, id)
		}
	}
	return out
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return 0
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func pairs(v any, f func(string, int64)) {
	l := asList(v)
	for i := 0; i+1 < len(l); i += 2 {
		k, _ := l[i].(string)
		f(k, toInt(l[i+1]))
	}
}
