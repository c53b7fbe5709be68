package redistest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotMove is a slot of the Cluster moving to another master the way
// `redis-cli --cluster reshard` moves it: IMPORTING on the new owner,
// MIGRATING on the old, the keys moved with MIGRATE, then NODE on every
// master, the new owner first. The old owner drops the subscribers of
// the slot's shard channels when it learns it lost the slot.
type SlotMove struct {
	Slot     int
	From, To *Server // the old and the new owner
	nodes    []*Server
	clients  []*redis.Client
	ids      []string
}

// StartSlotMove moves the slot of key to the master after its owner, up
// to NODE on the new owner: the other masters, the old owner among them,
// learn of it by Finish (or MoveSlot).
func (c *Cluster) StartSlotMove(tb testing.TB, key string) *SlotMove {
	tb.Helper()
	m := c.MigrateSlotKeys(tb, key)
	m.Finish(tb, m.To)
	return m
}

// MigrateSlotKeys moves the keys of key's slot to the master after its
// owner, and stops short of NODE: the slot is IMPORTING on the new
// owner and MIGRATING on the old, which answers a command on the
// slot's keys with -ASK, as in the middle of a reshard. Finish (To
// first) ends the move.
func (c *Cluster) MigrateSlotKeys(tb testing.TB, key string) *SlotMove {
	tb.Helper()
	ctx := context.Background()
	m := &SlotMove{nodes: c.Nodes()}
	for _, n := range m.nodes {
		cl := n.Client(tb, func(o *redis.Options) { o.ReadTimeout = time.Second })
		id, err := cl.ClusterMyID(ctx).Result()
		if err != nil {
			tb.Fatalf("redistest: cluster myid: %v", err)
		}
		m.clients, m.ids = append(m.clients, cl), append(m.ids, id)
	}
	s, err := m.clients[0].ClusterKeySlot(ctx, key).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster keyslot: %v", err)
	}
	m.Slot = int(s)
	from := slices.Index(m.ids, m.owner(tb, 0))
	if from < 0 {
		tb.Fatalf("redistest: no master owns slot %d", m.Slot)
	}
	to := (from + 1) % len(m.nodes)
	m.From, m.To = m.nodes[from], m.nodes[to]
	m.do(tb, to, "CLUSTER", "SETSLOT", m.Slot, "IMPORTING", m.ids[from])
	m.do(tb, from, "CLUSTER", "SETSLOT", m.Slot, "MIGRATING", m.ids[to])
	for {
		keys, err := m.clients[from].ClusterGetKeysInSlot(ctx, m.Slot, 100).Result()
		if err != nil {
			tb.Fatalf("redistest: cluster getkeysinslot: %v", err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", m.To.Port(), "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		m.do(tb, from, args...)
	}
	return m
}

// Finish tells master n that the slot is the new owner's.
func (m *SlotMove) Finish(tb testing.TB, n *Server) {
	tb.Helper()
	m.do(tb, slices.Index(m.nodes, n), "CLUSTER", "SETSLOT", m.Slot, "NODE", m.ids[slices.Index(m.nodes, m.To)])
}

// MoveSlot moves the slot of key to another master and waits until every
// master agrees. It returns the move (old and new owner, slot).
func (c *Cluster) MoveSlot(tb testing.TB, key string) *SlotMove {
	tb.Helper()
	m := c.StartSlotMove(tb, key)
	m.Finish(tb, m.From)
	for _, n := range m.nodes {
		if n != m.From && n != m.To {
			m.Finish(tb, n)
		}
	}
	to := m.ids[slices.Index(m.nodes, m.To)]
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < len(m.clients); {
		if m.owner(tb, i) == to {
			i++
			continue
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: masters do not agree that %s owns slot %d", m.To.Addr(), m.Slot)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return m
}

// owner returns the ID of the master that master i says serves the slot.
func (m *SlotMove) owner(tb testing.TB, i int) string {
	tb.Helper()
	slots, err := m.clients[i].ClusterSlots(context.Background()).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster slots: %v", err)
	}
	for _, s := range slots {
		if s.Start <= m.Slot && m.Slot <= s.End && len(s.Nodes) > 0 {
			return s.Nodes[0].ID
		}
	}
	return ""
}

func (m *SlotMove) do(tb testing.TB, i int, args ...any) {
	tb.Helper()
	if err := m.clients[i].Do(context.Background(), args...).Err(); err != nil {
		tb.Fatalf("redistest: %v: %v", args[:min(len(args), 4)], err)
	}
}
