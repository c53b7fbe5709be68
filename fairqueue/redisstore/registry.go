package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The registry of queues: one sorted set per key prefix naming every
// queue an instance has opened, scored by the last time (ms, the
// registering instance's clock) an instance's heartbeat named it. A queue
// whose instances all crashed (no leave) and that no instance opens again
// keeps its keys, which no heartbeat or leave of its own would delete; the
// heartbeats of the other queues under the prefix find it in the registry
// and delete it once no instance has been live in it for DeadQueueAfter.

// DefaultDeadQueueAfter is Options.DeadQueueAfter's default: far longer
// than any lease, so that only a queue nobody serves any more goes.
const DefaultDeadQueueAfter = 10 * time.Minute

// sweepBatch bounds the queues one sweep deletes: a sweep runs beside
// the instance's traffic, and the next one goes on.
const sweepBatch = 64

// RegistryKey is the key of the sorted set naming the queues under
// prefix ("": DefaultKeyPrefix), e.g. "{fair_queue}:queues". No queue's
// key has that name: a queue's hash tag holds a colon.
func RegistryKey(prefix string) string {
	return "{" + braces.Replace(cmp.Or(prefix, DefaultKeyPrefix)) + "}:queues"
}

// unregister removes ARGV[1] from the registry KEYS[1] if its score is
// not later than ARGV[2]: an instance that registered the queue again
// since (it opened the queue after its keys were deleted) keeps it. With
// KEYS[2] (the name's tombstone, leftKey), it marks there for ARGV[3] ms
// that no register of ARGV[2] or earlier may name it again (register).
var unregister = redis.NewScript(`
if KEYS[2] then
  local t = redis.call('GET', KEYS[2])
  if not t or tonumber(t) < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
end
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
`)

// register names ARGV[1] in the registry KEYS[1] at ARGV[2] unless a
// later score stands: a register that reaches Redis late (a bounded
// call that outlived its context) must not write its earlier time over
// that of an instance that named the queue since, which the unregister
// following a register run after its store's last leave would then take
// out (Store.register). Nor does it where the name's tombstone KEYS[2]
// stands at ARGV[2] or later: a register sent before the last leave, its
// answer lost, that reaches Redis after it (unregister).
var register = redis.NewScript(`
local t = redis.call('GET', KEYS[2])
if t and tonumber(ARGV[2]) <= tonumber(t) then
  return 0
end
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) < tonumber(ARGV[2]) then
  return redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
end
return 0
`)

// leftKey is the key of the tombstone of registry name under prefix,
// beside the registry (one hash tag): the last leave of its queue writes
// it where a call of a node that left may still come, and it expires by
// itself after TombstoneTTL.
func leftKey(prefix, name string) string {
	return "{" + braces.Replace(cmp.Or(prefix, DefaultKeyPrefix)) + "}:left:" + name
}

// Unregister takes name out of the registry under prefix ("":
// DefaultKeyPrefix) unless an instance named it later than since (it
// opened the queue again): for the tools that delete a queue's keys, such
// as purge --dead, which would otherwise leave its name there.
func Unregister(ctx context.Context, rdb redis.Scripter, prefix, name string, since time.Time) error {
	key := RegistryKey(prefix)
	if err := unregister.Run(ctx, rdb, []string{key}, name, since.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("unregister %s: %w", key, err)
	}
	return nil
}

// registryName is the name under which the stores of queue name register
// it: as it stands in its keys' tag (braces replaced), so that the queues
// of names that share one tag ("x{", "x}", "x_": one queue in Redis) are
// one name there, which the leave that deletes their keys takes out,
// whichever queue leaves last.
func registryName(name string) string { return braces.Replace(name) }

// registerEvery is how often an instance's heartbeats name a queue in
// the registry again.
func (s *Store) registerEvery() time.Duration {
	return min(s.deadAfter/4, 10*time.Second)
}

// register names the queue in the registry, when the last time is
// registerEvery ago (or force). A failure is left to the next heartbeat.
func (s *Store) register(ctx context.Context, force bool) {
	if s.deadAfter < 0 {
		return
	}
	now := time.Now()
	if last := s.registered.Load(); !force && last != 0 && now.Sub(time.UnixMilli(last)) < s.registerEvery() {
		return
	}
	name := registryName(s.name)
	if s.registryCall(ctx, func() error {
		err := register.Run(ctx, s.rdb, []string{s.registry, leftKey(s.prefix, name)}, name, now.UnixMilli()).Err()
		bg := context.WithoutCancel(ctx)
		switch {
		case err == nil:
			if since := s.leftAt.Load(); since != 0 {
				// The call outlived its context (bounded) and ran once
				// this store's leave, the last, had deleted the keys: it
				// may have named the queue after the leave took it out,
				// for good.
				_ = Unregister(bg, s.rdb, s.prefix, name, time.UnixMilli(since))
			}
		case unanswered(err):
			// Redis may run it late, after the last leave: that leave
			// leaves the name's tombstone, which turns it away
			// (unregisterAfterLeave); or, where this store's leave, the
			// last, ran already, it is left now. Noted before leftAt is
			// read, as the leave stores leftAt before it reads this.
			s.lostRegister.Store(now.UnixMilli())
			if since := s.leftAt.Load(); since != 0 {
				_ = s.unregisterLeft(bg, time.UnixMilli(since), true)
			}
		}
		return err
	}) == nil {
		s.registered.Store(now.UnixMilli())
	}
}

// registryCall runs call, a command on the registry, ending at ctx's
// deadline where the client does not (see bounded): the answer of a call
// cut off is dropped.
func (s *Store) registryCall(ctx context.Context, call func() error) error {
	if !s.bound {
		return call()
	}
	return within(ctx, call, context.Context.Err)
}

// unregisterAfterLeave takes the queue out of the registry once the leave
// deleted its keys, unless an instance named it later than since, read
// after the leave's script (with DeadQueueAfter negative too: another
// instance may have named it). late (the leave kept the tombstones: a
// call of a node that left may still come), or a register of this store
// got no answer: the name's tombstone turns away, for a TombstoneTTL, a
// register sent before since that reaches Redis late.
func (s *Store) unregisterAfterLeave(ctx context.Context, since time.Time, late bool) error {
	s.leftAt.Store(since.UnixMilli()) // before the unregister and mayBeLate: see register
	return s.unregisterLeft(ctx, since, late || s.mayBeLate())
}

// unregisterBudget is the time left before ctx's deadline, read as a
// leave starts: its unregister gets as long (unregisterContext); 0
// without a deadline.
func unregisterBudget(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), 0)
	}
	return 0
}

// unregisterContext is the context of the unregister after the last
// leave's script, of a leave whose ctx had budget (unregisterBudget): a
// budget of its own, as long, so that a script answered only at the
// deadline (a loaded process) does not leave the name of a queue given
// back; ctx as it is where it has no deadline.
func unregisterContext(ctx context.Context, budget time.Duration) (context.Context, context.CancelFunc) {
	if budget <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), budget)
}

// unregisterLeft runs unregister for the queue's last leave at since,
// with the name's tombstone where tomb.
func (s *Store) unregisterLeft(ctx context.Context, since time.Time, tomb bool) error {
	name := registryName(s.name)
	keys, args := []string{s.registry}, []any{name, since.UnixMilli()}
	if tomb {
		keys, args = append(keys, leftKey(s.prefix, name)), append(args, TombstoneTTL.Milliseconds())
	}
	if err := unregister.Run(ctx, s.sc, keys, args...).Err(); err != nil {
		return fmt.Errorf("leave %s: unregister %s: %w", s.tag, s.registry, err)
	}
	return nil
}

// sweeps spaces the sweeps of one process: one per client and prefix
// every sweepEvery (that of the store whose heartbeat asks: a store with
// a shorter DeadQueueAfter looks at its own pace), whichever of their
// queues' heartbeats comes first. It holds when each last started.
var sweeps struct {
	sync.Mutex
	last map[string]time.Time
}

// sweepEvery is how often one process looks for dead queues.
func (s *Store) sweepEvery() time.Duration {
	return min(s.deadAfter/4, time.Minute)
}

// sweepDue reports whether this process should look for dead queues
// under the store's client and prefix now; the first look is a
// sweepEvery after the first heartbeat.
func (s *Store) sweepDue(now time.Time) bool {
	if s.deadAfter < 0 {
		return false
	}
	key := fmt.Sprintf("%p\x00%s", s.rdb, s.prefix)
	sweeps.Lock()
	defer sweeps.Unlock()
	if sweeps.last == nil {
		sweeps.last = map[string]time.Time{}
	}
	last, ok := sweeps.last[key]
	if ok && now.Sub(last) < s.sweepEvery() {
		return false
	}
	sweeps.last[key] = now
	return ok
}

// maybeSweep starts a sweep in the background when one is due and none
// of this store's is running; Close waits for it.
func (s *Store) maybeSweep() {
	if !s.sweepDue(time.Now()) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sweepCancel != nil || s.closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	s.sweepCancel = cancel
	s.sweeping.Add(1)
	go func() {
		defer s.sweeping.Done()
		_, _ = s.SweepDead(ctx)
		s.mu.Lock()
		s.sweepCancel = nil
		s.mu.Unlock()
		cancel()
	}()
}

// SweepDead deletes the queues under the store's prefix (up to 64 a
// call) that the registry says no instance has named for DeadQueueAfter
// and whose keys no instance has kept alive for as long: their instances
// all crashed and none opened them since. The check and the delete of
// each queue are one script (PurgeDead), so an instance that joins
// meanwhile keeps its queue. A queue the registry names late but that
// has a live instance (one that does not register) is named again now.
// It returns the number of queues deleted, and the first error met (a
// queue that could not be looked at is named again, and the sweep goes
// on). The instances' heartbeats run it on their own; it is exported for
// tests and tools.
func (s *Store) SweepDead(ctx context.Context) (int, error) {
	if s.deadAfter < 0 {
		return 0, nil
	}
	now := time.Now()
	cutoff := now.Add(-s.deadAfter).UnixMilli()
	var names []string
	err := s.registryCall(ctx, func() (err error) {
		names, err = s.rdb.ZRangeByScore(ctx, s.registry, &redis.ZRangeBy{
			Min: "-inf", Max: strconv.FormatInt(cutoff, 10), Count: sweepBatch,
		}).Result()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", s.registry, err)
	}
	deleted := 0
	var failed error // the first queue that could not be looked at
	for _, name := range names {
		other := New(s.rdb, name, Options{KeyPrefix: s.prefix})
		dead, err := other.PurgeDead(ctx, s.deadAfter)
		if err != nil {
			if ctx.Err() != nil {
				return deleted, err
			}
			// Named again, so that it does not hold back the queues
			// named after it at every look: looked at after another
			// DeadQueueAfter.
			failed, dead = cmp.Or(failed, err), false
		}
		if !dead {
			err = s.registryCall(ctx, func() error {
				return s.rdb.ZAddXX(ctx, s.registry, redis.Z{Score: float64(now.UnixMilli()), Member: name}).Err()
			})
		} else {
			deleted++
			err = Unregister(ctx, s.sc, s.prefix, name, time.UnixMilli(cutoff))
		}
		if err != nil {
			return deleted, fmt.Errorf("sweep %s: %w", s.registry, err)
		}
	}
	return deleted, failed
}

// stopSweep cancels a running sweep and waits for it; no sweep starts
// after.
func (s *Store) stopSweep() {
	s.mu.Lock()
	s.closed = true
	if s.sweepCancel != nil {
		s.sweepCancel()
	}
	s.mu.Unlock()
	s.sweeping.Wait()
}
