package fairqueue

import (
	"context"
	"time"
)

// Inspector is implemented by stores that can show a queue's live state
// to an operator and clear it.
type Inspector interface {
	// Inspect returns a snapshot of the queue with at most head waiting
	// tickets and the flows busiest tickets.
	Inspect(ctx context.Context, head, flows int) (Snapshot, error)
	// Purge deletes the queue's whole state, for an operator clearing a
	// broken queue: every node's waiters and permits are forgotten.
	Purge(ctx context.Context) error
}

// Snapshot is a queue's live state across every node.
type Snapshot struct {
	// Waiting is the number of tickets queued.
	Waiting int `json:"waiting"`
	// Head lists the first tickets in grant order: in a fair queue
	// (tenants or priority bands) the first ticket of each flow that may
	// be served now, then the FIFO tickets.
	Head []string `json:"head"`
	// Holders are the tickets holding a permit.
	Holders []Holder `json:"holders"`
	// Nodes are the nodes known to the store, live or recently dead.
	Nodes []NodeInfo `json:"nodes"`
	// Flows are the busiest flows (tenant and priority band, hashed) by
	// tickets waiting; empty for a FIFO queue.
	Flows []FlowInfo `json:"flows,omitempty"`
	// TokensHeld is the KV-cache tokens the holders hold (their
	// Request.Tokens); 0 when the queue does not count tokens.
	TokensHeld int `json:"tokens_held,omitempty"`
	// LearnedShare is the queue's share of its configured capacity in
	// force (Config.Adaptive, without a pool; with one, each upstream has
	// its own: UpstreamInfo.LearnedShare); 0 when nothing was learned.
	LearnedShare float64 `json:"learned_share,omitempty"`
	// Grants is the number of grants made since the queue's state began.
	Grants int64 `json:"grants"`
	// Upstreams are the pool upstreams the store knows of (holding
	// permits or cooling), by dial address; empty without a pool.
	Upstreams []UpstreamInfo `json:"upstreams,omitempty"`
}

// Holder is one held permit.
type Holder struct {
	Ticket string `json:"ticket"`
	Node   string `json:"node"`
	// LeaseLeft is the time until the lease ends unless renewed.
	LeaseLeft time.Duration `json:"lease_left"`
	// Upstream is the pool upstream it runs on ("" without a pool).
	Upstream string `json:"upstream,omitempty"`
	// Tokens is its request's KV-cache tokens (Request.Tokens, clamped);
	// 0 when not counted.
	Tokens int `json:"tokens,omitempty"`
}

// NodeInfo is one node's liveness.
type NodeInfo struct {
	ID string `json:"id"`
	// Alive reports whether its liveness has not yet expired.
	Alive bool `json:"alive"`
	// ExpiresIn is the time until it is considered dead (negative: dead
	// that long).
	ExpiresIn time.Duration `json:"expires_in"`
}

// FlowInfo is one flow's backlog and use (a flow is a tenant, hashed, in
// one priority band: "<tenant key>.<band>").
type FlowInfo struct {
	Flow    string `json:"flow"`
	Waiting int    `json:"waiting"`
	// Held is the number of permits the flow's requests hold.
	Held int `json:"held"`
	// Usage is the flow's usage counter minus the queue's virtual time,
	// in cost units divided by weight: above 0, the flow has used more
	// than the least-served flows waiting; the least usage is served
	// first.
	Usage float64 `json:"usage"`
}

// Inspect returns the queue's live state from the store, or
// ErrStoreUnavailable wrapped when the store cannot show it.
func (q *Queue) Inspect(ctx context.Context, head, flows int) (Snapshot, error) {
	in, ok := q.store.(Inspector)
	if !ok {
		return Snapshot{}, ErrStoreUnavailable
	}
	return in.Inspect(ctx, head, flows)
}
