package notifier_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
	"github.com/fair-queue/caddy-fair-queue/notifier"
)

// events records what a Subscription reported to its Listener.
type events struct {
	messages   chan string
	subscribed chan struct{}
}

func newEvents() *events {
	return &events{messages: make(chan string, 64), subscribed: make(chan struct{}, 64)}
}

func (e *events) listener() notifier.Listener {
	return notifier.Listener{
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
	sub, err := notifier.Subscribe(ctx, cluster.ClusterClient(t), channel, true, ev.listener())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub := cluster.ClusterClient(t)

	require.NoError(t, pub.SPublish(ctx, channel, "before").Err())
	assert.Equal(t, "before", ev.message(t, 5*time.Second))

	mv := cluster.MoveSlot(t, channel)
	from, to := mv.From, mv.To
	moved := time.Now()
	t.Logf("moved slot %d of %s from %s to %s", mv.Slot, channel, from.Addr(), to.Addr())

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
	sub, err := notifier.Subscribe(context.Background(), rdb, channel, true, ev.listener())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	m := cluster.StartSlotMove(t, channel)
	to := m.To
	to.Freeze()
	t.Cleanup(to.Thaw)
	m.Finish(t, m.From) // the old owner unsubscribes sub
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
	sub, err := notifier.Subscribe(ctx, rdb, "node:a", false, ev.listener())
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

// A Subscription reads its connection itself; a silent one pings Redis
// (a broken connection fails the ping and is replaced), and one whose
// connection Redis closed subscribes again and says so.
func TestSilentSubscriptionPingsAndAKilledOneSubscribesAgain(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	ev := newEvents()
	sub, err := notifier.Subscribe(ctx, rdb, "node:a", false, ev.listener())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	require.Eventually(t, func() bool {
		list, err := rdb.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
		return err == nil && strings.Contains(list, "cmd=ping")
	}, 10*time.Second, 100*time.Millisecond, "no ping on the silent subscription")
	require.NoError(t, rdb.Publish(ctx, "node:a", "one").Err())
	assert.Equal(t, "one", ev.message(t, 5*time.Second))

	require.NoError(t, rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err())
	select {
	case <-ev.subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("not subscribed again after its connection was killed")
	}
	require.NoError(t, rdb.Publish(ctx, "node:a", "two").Err())
	assert.Equal(t, "two", ev.message(t, 5*time.Second))
}
