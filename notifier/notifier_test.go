package notifier_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
	"github.com/fair-queue/caddy-fair-queue/notifier"
)

// events records what a Subscription reported to its Handler.
type events struct {
	messages   chan string
	subscribed chan struct{}
}

func newEvents() *events {
	return &events{messages: make(chan string, 64), subscribed: make(chan struct{}, 64)}
}

func (e *events) handler() notifier.Handler {
	return notifier.Handler{
		Message:    func(p string) { e.messages <- p },
		Subscribed: func() { e.subscribed <- struct{}{} },
	}
}

// message waits up to d for the next message.
func (e *events) message(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case m := <-e.messages:
		return m
	case <-time.After(d):
		t.Fatalf("no message within %v", d)
		return ""
	}
}

// When Redis Cluster moves the slot of a shard channel to another
// master, the old master unsubscribes the client itself (sunsubscribe);
// the Subscription subscribes again, on the new owner, and reports it
// through Subscribed, so that the caller reconciles what it missed.
func TestShardChannelFollowsItsSlotToAnotherMaster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const channel = "{fq:test}:node:a"
	ctx := context.Background()
	ev := newEvents()
	sub, err := notifier.Subscribe(ctx, cluster.ClusterClient(t), channel, true, ev.handler())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub := cluster.ClusterClient(t)

	require.NoError(t, pub.SPublish(ctx, channel, "before").Err())
	assert.Equal(t, "before", ev.message(t, 5*time.Second))

	from, to := moveSlot(t, cluster, channel)
	moved := time.Now()
	t.Logf("moved slot %d of %s from %s to %s", slotOf(t, pub, channel), channel, from.Addr(), to.Addr())

	select {
	case <-ev.subscribed:
		t.Logf("subscribed again %v after the masters agreed", time.Since(moved).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("Subscribed not called within 10s of the slot moving: the channel is dead")
	}
	chs, err := to.Client(t).PubSubShardChannels(ctx, channel).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{channel}, chs, "shard channels on the new owner")

	n, err := pub.SPublish(ctx, channel, "after").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "receivers of SPUBLISH on the new owner")
	assert.Equal(t, "after", ev.message(t, 5*time.Second))
	require.NoError(t, sub.Close())
}

// Close ends a resubscription that cannot succeed (the slot's new owner
// is frozen) within the client's timeouts.
func TestCloseEndsResubscriptionToUnreachableOwner(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const channel = "{fq:test}:node:a"
	rdb := cluster.ClusterClient(t, func(o *redis.ClusterOptions) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	})
	ev := newEvents()
	sub, err := notifier.Subscribe(context.Background(), rdb, channel, true, ev.handler())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	m := startSlotMove(t, cluster, channel)
	to := m.nodes[m.to]
	to.Freeze()
	t.Cleanup(to.Thaw)
	m.finish(t, m.from) // the old owner unsubscribes sub
	time.Sleep(2 * time.Second)
	assert.Empty(t, ev.subscribed, "subscribed to a frozen master")

	start := time.Now()
	require.NoError(t, sub.Close())
	t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))
	assert.Less(t, time.Since(start), 3*time.Second, "Close took")
}

// A Subscription that Close ends is not subscribed again, and Close
// returns at once.
func TestCloseDoesNotSubscribeAgain(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	ev := newEvents()
	sub, err := notifier.Subscribe(ctx, rdb, "node:a", false, ev.handler())
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, sub.Close())
	assert.Less(t, time.Since(start), time.Second, "Close took")
	assert.Empty(t, ev.subscribed)
	assert.Eventually(t, func() bool {
		chs, err := rdb.PubSubChannels(ctx, "*").Result()
		return err == nil && len(chs) == 0
	}, 5*time.Second, 10*time.Millisecond, "channels left subscribed")
}

func slotOf(t *testing.T, rdb redis.UniversalClient, channel string) int {
	t.Helper()
	slot, err := rdb.ClusterKeySlot(context.Background(), channel).Result()
	require.NoError(t, err)
	return int(slot)
}

// moveSlot moves the slot of key to another master and waits until
// every master agrees. It returns the old and the new owner.
func moveSlot(t *testing.T, c *redistest.Cluster, key string) (from, to *redistest.Server) {
	t.Helper()
	m := startSlotMove(t, c, key)
	m.finish(t, m.from)
	for i := range m.nodes {
		if i != m.from && i != m.to {
			m.finish(t, i)
		}
	}
	require.Eventually(t, func() bool {
		for _, cl := range m.clients {
			if slotOwner(t, cl, m.slot) != m.ids[m.to] {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "masters do not agree that %s owns slot %d", m.nodes[m.to].Addr(), m.slot)
	return m.nodes[m.from], m.nodes[m.to]
}

// slotMove is a slot moving to another master the way redis-cli
// --cluster reshard does it: IMPORTING on the new owner, MIGRATING on
// the old, the keys moved with MIGRATE, then NODE on every master, the
// new owner first. The old owner drops the subscribers of the slot's
// shard channels when it learns it lost the slot.
type slotMove struct {
	slot     int
	from, to int // indexes into nodes
	nodes    []*redistest.Server
	clients  []*redis.Client
	ids      []string
}

// startSlotMove moves the slot of key to the master after its owner,
// up to NODE on the new owner; finish tells the others.
func startSlotMove(t *testing.T, c *redistest.Cluster, key string) *slotMove {
	t.Helper()
	ctx := context.Background()
	m := &slotMove{nodes: c.Nodes()}
	for _, n := range m.nodes {
		cl := n.Client(t, func(o *redis.Options) { o.ReadTimeout = time.Second })
		id, err := cl.ClusterMyID(ctx).Result()
		require.NoError(t, err)
		m.clients, m.ids = append(m.clients, cl), append(m.ids, id)
	}
	m.slot = slotOf(t, m.clients[0], key)
	m.from = slices.Index(m.ids, slotOwner(t, m.clients[0], m.slot))
	require.NotEqual(t, -1, m.from, "no master owns slot %d", m.slot)
	m.to = (m.from + 1) % len(m.nodes)

	require.NoError(t, m.clients[m.to].Do(ctx, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.ids[m.from]).Err())
	require.NoError(t, m.clients[m.from].Do(ctx, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.ids[m.to]).Err())
	for {
		keys, err := m.clients[m.from].ClusterGetKeysInSlot(ctx, m.slot, 100).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", m.nodes[m.to].Port(), "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, m.clients[m.from].Do(ctx, args...).Err())
	}
	m.finish(t, m.to)
	return m
}

// finish tells master i that the slot is the new owner's.
func (m *slotMove) finish(t *testing.T, i int) {
	t.Helper()
	require.NoError(t, m.clients[i].Do(context.Background(), "CLUSTER", "SETSLOT", m.slot, "NODE", m.ids[m.to]).Err())
}

// slotOwner returns the ID of the master that rdb says serves slot.
func slotOwner(t *testing.T, rdb *redis.Client, slot int) string {
	t.Helper()
	slots, err := rdb.ClusterSlots(context.Background()).Result()
	require.NoError(t, err)
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End && len(s.Nodes) > 0 {
			return s.Nodes[0].ID
		}
	}
	return ""
}
