// Package redisstore is the Redis implementation of fairqueue.Store: one
// named queue kept in a few keys under one hash tag, changed only by the
// Lua scripts in lua/ (each idempotent by ticket ID, because go-redis
// re-sends a command after a read timeout), with grants delivered over a
// per-node Pub/Sub channel (package notifier).
package redisstore

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/notifier"
)

// Client defaults for a queue's Redis client: a frozen Redis must not
// block a request for the ~20 s go-redis' defaults allow.
const (
	DefaultDialTimeout  = 500 * time.Millisecond
	DefaultReadTimeout  = 500 * time.Millisecond
	DefaultWriteTimeout = 500 * time.Millisecond
	DefaultMaxRetries   = 1
	DefaultKeyPrefix    = "fair_queue"
	// TombstoneTTL is how long a cancelled ticket's tombstone lives:
	// longer than any retry of its acquire can be in flight; a ticket's a
	// requeue gave back, during which a copy of that requeue queues
	// nothing; and a node's that left, during which its calls that reach
	// Redis late (sent before its leave) change nothing.
	TombstoneTTL = 30 * time.Second
	// inFlight is how long a fresh grant's message is given to arrive
	// before Reconcile reports the holder as a grant to look into.
	inFlight = 100 * time.Millisecond
)

//go:embed lua/*.lua
var luaFS embed.FS

var scripts = struct {
	acquire, release, transfer, cancel, requeue, heartbeat, reconcile, leave, inspect, adapt *redis.Script
}{
	adapt:     load("adapt"),
	transfer:  load("transfer"),
	requeue:   load("requeue"),
	inspect:   load("inspect"),
	acquire:   load("acquire"),
	release:   load("release"),
	cancel:    load("cancel"),
	heartbeat: load("heartbeat"),
	reconcile: load("reconcile"),
	leave:     load("leave"),
}

// keyNames are the queue's keys, in the order of every script's KEYS;
// the scripts name them K.<name> (lua/common.lua). "tlast" is no longer
// written: it is listed so that a queue's state written by an earlier
// version is still deleted with the rest (leave, purge).
var keyNames = []string{"seq", "waiting", "holders", "nodes", "epoch", "grants", "gone", "vtime", "twait", "expired", "members",
	"fwait", "fticket", "fready", "fcount", "fidle", "finf", "tlast", "uheld", "ucool", "ulast",
	"tok", "thold", "tsum", "tup", "tpass", "adapt", "freed", "upool"}

// keyTable is the Lua table K that names KEYS by keyNames.
func keyTable() string {
	var b strings.Builder
	b.WriteString("local K = {")
	for i, k := range keyNames {
		fmt.Fprintf(&b, "%s = KEYS[%d], ", k, i+1)
	}
	b.WriteString("}\n")
	return b.String()
}

// prelude are the files every script starts with, in order: the
// functions the scripts share.
var prelude = []string{"common", "tokens", "pool", "fair", "dispatch"}

func load(name string) *redis.Script {
	var b strings.Builder
	b.WriteString(keyTable())
	for _, f := range append(prelude, name) {
		src, err := luaFS.ReadFile("lua/" + f + ".lua")
		if err != nil {
			panic(err)
		}
		b.Write(src)
		b.WriteString("\n")
	}
	return redis.NewScript(b.String())
}

// Options configure a Store.
type Options struct {
	// KeyPrefix starts every key name; it isolates applications sharing
	// one Redis. Default "fair_queue".
	KeyPrefix string
	// Sharded selects SPUBLISH/SSUBSCRIBE (Redis 7+; a shard-local
	// channel on Cluster) over PUBLISH/SUBSCRIBE. nil: detected at Open
	// from the server version.
	Sharded *bool
	// DeadQueueAfter is how long every instance of another queue under
	// the prefix must have been gone (crashed: no leave, and no lease
	// left) before this store's heartbeats delete that queue's keys
	// (SweepDead). Default DefaultDeadQueueAfter; negative: never, and
	// the queue is not named in the registry (RegistryKey); the leave
	// that deletes its keys still takes out a name another instance put
	// there.
	DeadQueueAfter time.Duration
}

// Store is one named queue in Redis. Create one per Queue (it holds that
// node's subscription; Open refuses a second node until Close); the Redis
// client may be shared and is not closed by the Store.
type Store struct {
	rdb      redis.UniversalClient
	sc       redis.Scripter // runs the scripts: rdb, bounded where rdb ignores contexts
	bound    bool           // rdb ignores contexts: calls are bounded here
	tag      string
	keys     []string // the common KEYS layout (lua/common.lua)
	chPrefix string
	sharded  *bool
	// pub is the command that publishes a grant, set by Open; Inspect,
	// which publishes nothing, may run meanwhile (the admin API).
	pub atomic.Pointer[string]

	// The registry of queues (registry.go).
	name, prefix, registry string
	deadAfter              time.Duration
	registered             atomic.Int64 // when a heartbeat last named the queue, ms
	// leftAt is the since (ms) of this store's leave that deleted the
	// queue's keys, until the next Open: a register still on its way
	// then takes the name out again (register).
	leftAt atomic.Int64
	// lostRegister is when a register last got no answer (unix ms): Redis
	// may still run it, after the last leave. A later answer does not
	// settle it (unsure): the register's connection, closed on its
	// failure, may be read after another's (a loaded Redis).
	lostRegister atomic.Int64
	// unsure is when a call last failed with no answer from Redis (unix
	// ms; 0: none since a later call's answer): Redis may still run it,
	// late (failed, settled).
	unsure atomic.Int64

	mu          sync.Mutex
	node        string // the node Open is for, until Close: another is refused
	sub         *notifier.Subscription
	h           fairqueue.Listener // set by Open: receives grants scripts return to their caller
	sweepCancel context.CancelFunc // the running sweep's; nil when none runs
	sweeping    sync.WaitGroup
	closed      bool // set by Close: no sweep starts until the next Open
}

// New returns a Store for queue name on rdb. It makes no Redis call.
// Each call ends at its context's deadline: with a client that does not
// honour contexts (go-redis without ContextTimeoutEnabled, its default),
// by a goroutine per call that stops waiting for the answer.
func New(rdb redis.UniversalClient, name string, opts Options) *Store {
	tag := TagOf(opts.KeyPrefix, name)
	s := &Store{rdb: rdb, sc: rdb, tag: tag, chPrefix: tag + ":node:", sharded: opts.Sharded,
		name: name, prefix: opts.KeyPrefix, registry: RegistryKey(opts.KeyPrefix), deadAfter: opts.DeadQueueAfter}
	if s.deadAfter == 0 {
		s.deadAfter = DefaultDeadQueueAfter
	}
	if !honoursContext(rdb) {
		s.sc, s.bound = bounded{rdb}, true
	}
	for _, k := range keyNames {
		s.keys = append(s.keys, tag+":"+k)
	}
	return s
}

// Tag returns the hash tag shared by every key of the queue, e.g.
// "{fair_queue:default}"; every key name starts with it.
func (s *Store) Tag() string { return s.tag }

func (s *Store) args(first string, l fairqueue.Limits, more ...any) []any {
	permits := strconv.Itoa(l.Permits)
	if l.Tokens != 0 || l.Learned {
		permits += " " + strconv.Itoa(l.Tokens) + " " + strconv.Itoa(l.TokenBound)
	}
	if l.Learned {
		permits += " a"
	}
	return append([]any{first, permits, l.Lease.Milliseconds(), s.chPrefix, s.publish(), l.MaxInFlightPerTenant, poolArg(l.Upstreams)}, more...)
}

// publish is the command that publishes a grant; "" before Open.
func (s *Store) publish() string {
	if p := s.pub.Load(); p != nil {
		return *p
	}
	return ""
}

// deliver hands the caller's own grants (decodeGrants), made under the
// call's limits l, to its Listener.
func (s *Store) deliver(l fairqueue.Limits, gs []fairqueue.Grant) {
	if len(gs) == 0 {
		return
	}
	for i := range gs {
		gs[i].Permits = l.Permits
	}
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	if h != nil {
		h.Granted(gs...)
	}
}

// Acquire implements fairqueue.Store.
func (s *Store) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	u := s.unsure.Load()
	v, err := scripts.acquire.Run(ctx, s.sc, s.keys, s.args(t.ID, t.Limits, t.Node, newEpoch(),
		costArg(t), t.MaxQueue, t.MaxQueuePerTenant)...).Slice()
	if err != nil {
		return fairqueue.AcquireResult{}, fmt.Errorf("acquire %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	res, own, err := decodeAcquire(v)
	if err != nil {
		return res, fmt.Errorf("acquire %s: %w", s.tag, err)
	}
	s.deliver(t.Limits, own)
	return res, nil
}

// Release implements fairqueue.Store.
func (s *Store) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	sent := time.Now()
	u := s.unsure.Load()
	v, err := scripts.release.Run(ctx, s.sc, s.keys, s.args(t.ID, t.Limits,
		strconv.FormatFloat(t.Correction, 'g', -1, 64), t.Cool, t.CoolFor.Milliseconds(), mark(t.Tombstone))...).Result()
	if err != nil {
		return fmt.Errorf("release %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	r, err := decodeRelease(v)
	if err != nil {
		return fmt.Errorf("release %s: %w", s.tag, err)
	}
	s.deliver(t.Limits, r.own)
	s.heads(r.heads, t, sent)
	return nil
}

// Transfer implements fairqueue.Transferrer.
func (s *Store) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	sent := time.Now()
	u := s.unsure.Load()
	v, err := scripts.transfer.Run(ctx, s.sc, s.keys, s.args(t.ID, t.Limits, to, mark(t.Tombstone))...).Result()
	if err != nil {
		return fmt.Errorf("transfer %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	r, err := decodeTransfer(v, to)
	if err != nil {
		return fmt.Errorf("transfer %s: %w", s.tag, err)
	}
	s.deliver(t.Limits, r.own)
	s.heads(r.heads, t, sent)
	return nil
}

// mark is a script's flag argument: "1" or "0".
func mark(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// heads tells the Listener, if it takes local handoffs, which of its
// tickets head the queue (ids, in order; none: another node's does),
// chosen under t's settings by a call sent at sent: at t.LimitsRead, if
// earlier, when the node read those settings (a reload may have landed
// since, and the node drops heads named by calls sent before it).
func (s *Store) heads(ids []string, t fairqueue.TicketArgs, sent time.Time) {
	if !t.LimitsRead.IsZero() && t.LimitsRead.Before(sent) {
		sent = t.LimitsRead
	}
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	if hh, ok := h.(fairqueue.HeadListener); ok {
		hh.Heads(ids, t.Permits, sent)
	}
}

// Cancel implements fairqueue.Store.
func (s *Store) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	ttl := int64(0)
	if t.Tombstone {
		ttl = TombstoneTTL.Milliseconds()
	}
	u := s.unsure.Load()
	v, err := scripts.cancel.Run(ctx, s.sc, s.keys, s.args(t.ID, t.Limits, ttl,
		strconv.FormatFloat(t.Correction, 'g', -1, 64))...).Result()
	if err != nil {
		return fmt.Errorf("cancel %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	s.deliver(t.Limits, decodeGrants(v))
	return nil
}

// Heartbeat implements fairqueue.Store.
func (s *Store) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	more := make([]any, 0, 5+len(hb.Held)+len(hb.Pending)+len(hb.Adopt))
	more = append(more, hb.Epoch, newEpoch(), strconv.FormatUint(hb.Beat, 10), len(hb.Held), len(hb.Pending))
	for i, l := range [][]string{hb.Held, hb.Pending, hb.Adopt} {
		for _, id := range l {
			arg := id
			if up := hb.Upstreams[id]; up != "" && i != 1 { // counts on its upstream if added again
				arg += " u=" + up
			}
			if w := hb.Tokens[id]; w > 0 { // weighs its tokens if added again, or recorded again (pending)
				arg += " w=" + strconv.Itoa(w)
			}
			more = append(more, arg)
		}
	}
	u := s.unsure.Load()
	v, err := scripts.heartbeat.Run(ctx, s.sc, s.keys, s.args(hb.Node, hb.Limits, more...)...).Slice()
	if err != nil {
		return fairqueue.HeartbeatResult{}, fmt.Errorf("heartbeat %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	res, err := decodeHeartbeat(v)
	if err != nil {
		return res, fmt.Errorf("heartbeat %s: %w", s.tag, err)
	}
	// A changed data set or a node forgotten meanwhile may have seen the
	// queue's keys (and its name in the registry) deleted: named now. So
	// is the node's first heartbeat (Rejoined too): the last leave of
	// another instance may have taken out the name this store's Open put
	// there.
	s.register(ctx, res.Rejoined || res.Epoch != hb.Epoch)
	s.maybeSweep()
	return res, nil
}

// Reconcile implements fairqueue.Store.
func (s *Store) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	u := s.unsure.Load()
	v, err := scripts.reconcile.Run(ctx, s.sc, s.keys, s.args(node, l, inFlight.Milliseconds())...).Slice()
	if err != nil {
		return fairqueue.ReconcileResult{}, fmt.Errorf("reconcile %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	res, own, err := decodeReconcile(v)
	if err != nil {
		return res, fmt.Errorf("reconcile %s: %w", s.tag, err)
	}
	s.deliver(l, own)
	return res, nil
}

// Leave implements fairqueue.Store.
func (s *Store) Leave(ctx context.Context, node string, l fairqueue.Limits) error {
	// The node's tombstone: a call of it that reaches Redis after the
	// leave (sent before it, late) changes nothing. Where a call of the
	// store may still be on its way, the last leave keeps the tombstones
	// (a key that expires by itself) for such a call to find.
	late := "0"
	if s.mayBeLate() {
		late = "1"
	}
	budget := unregisterBudget(ctx)
	v, err := scripts.leave.Run(ctx, s.sc, s.keys, s.args(node, l, TombstoneTTL.Milliseconds(), late)...).Slice()
	if err != nil {
		return fmt.Errorf("leave %s: %w", s.tag, busy(err))
	}
	if len(v) > 1 && toInt(v[1]) == 1 { // no live node left: every key deleted
		// Read once the script has run, not before it: an instance that
		// named the queue while this leave was on its way (a heartbeat,
		// an Open) and left before it, the leave then the last, named it
		// before the keys went; only a name put there after (an instance
		// that opened the queue again) stays.
		since := time.Now()
		// A call of a node that left may still come (the leave kept the
		// tombstones for it): a register among them, which the registry's
		// tombstone turns away.
		kept := len(v) > 2 && toInt(v[2]) == 1
		uctx, cancel := unregisterContext(ctx, budget)
		defer cancel()
		if s.deadAfter >= 0 {
			return s.unregisterAfterLeave(uctx, since, kept)
		}
		// A store that does not register still takes out the name another
		// instance of the queue put there (one with the registry on), or
		// the registry's key stays for good; its Redis user may not reach
		// that key, so a failure is not the leave's.
		_ = s.unregisterAfterLeave(uctx, since, kept)
	}
	return nil
}

// epochPrefix and epochCount make epoch candidates: unique across
// processes (a random prefix) and calls (a counter), without a random
// read on every acquire.
var (
	epochPrefix = func() string {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "-"
	}()
	epochCount atomic.Uint64
)

// newEpoch returns a data-set ID candidate no other call has used: the
// scripts set it only where the epoch key is missing (the data was lost).
func newEpoch() string {
	return epochPrefix + strconv.FormatUint(epochCount.Add(1), 36)
}

// Inspect implements fairqueue.Inspector with one read-only script.
func (s *Store) Inspect(ctx context.Context, head, flows int) (fairqueue.Snapshot, error) {
	args := s.args("", fairqueue.Limits{}, max(head, 0), max(flows, 0))
	v, err := scripts.inspect.RunRO(ctx, s.sc, s.keys, args...).Slice()
	if err != nil && strings.Contains(err.Error(), "unknown command") { // before Redis 7: no EVAL_RO
		v, err = scripts.inspect.Run(ctx, s.sc, s.keys, args...).Slice()
	}
	if err != nil {
		return fairqueue.Snapshot{}, fmt.Errorf("inspect %s: %w", s.tag, err)
	}
	snap, err := decodeInspect(v)
	if err != nil {
		return snap, fmt.Errorf("inspect %s: %w", s.tag, err)
	}
	return snap, nil
}

var (
	_ fairqueue.Store       = (*Store)(nil)
	_ fairqueue.Inspector   = (*Store)(nil)
	_ fairqueue.Transferrer = (*Store)(nil)
)

// Requeue implements fairqueue.Store.
func (s *Store) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	u := s.unsure.Load()
	v, err := scripts.requeue.Run(ctx, s.sc, s.keys, s.args(t.ID, t.Limits, t.Node, newEpoch(),
		costArg(t.TicketArgs), t.Old, t.Seq,
		strconv.FormatFloat(t.Correction, 'g', -1, 64), t.Cool, t.CoolFor.Milliseconds(), mark(t.Tombstone),
		TombstoneTTL.Milliseconds())...).Slice()
	if err != nil {
		return fairqueue.AcquireResult{}, fmt.Errorf("requeue %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	res, own, err := decodeAcquire(v)
	if err != nil {
		return res, fmt.Errorf("requeue %s: %w", s.tag, err)
	}
	s.deliver(t.Limits, own)
	return res, nil
}

// poolArg is the scripts' form of a pool: "<dial> <permits>[/<tokens>] ...".
func poolArg(us []fairqueue.Upstream) string {
	var b strings.Builder
	for _, u := range us {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(u.Dial)
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(u.Permits))
		if u.KVTokens != 0 {
			b.WriteByte('/')
			b.WriteString(strconv.Itoa(u.KVTokens))
		}
	}
	return b.String()
}

// costArg is the scripts' form of a ticket's cost and weight: "<cost>",
// or "<cost> <tokens>" when it weighs tokens, "<cost> <tokens> <asks>"
// when it asks more (TicketArgs.Asks).
func costArg(t fairqueue.TicketArgs) string {
	c := strconv.FormatFloat(t.Cost, 'g', -1, 64)
	if t.Tokens > 0 {
		c += " " + strconv.Itoa(t.Tokens)
		if t.Asks > t.Tokens {
			c += " " + strconv.Itoa(t.Asks)
		}
	}
	return c
}
