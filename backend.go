package caddyfairqueue

import (
	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// backend is where a handler's queues live: in Redis (redisBackend) or
// in this process (localBackend). Two handlers whose backends have the
// same storeID share engines (and so waiting tickets and permits survive
// a config reload); two whose backends have the same dataID read and
// write the same queues.
type backend interface {
	// storeID identifies the store's whole configuration: the client's
	// and the key prefix. It holds no secret.
	storeID() string
	// dataID identifies the data the store reads and writes: equal data
	// IDs and queue keys are one queue.
	dataID() string
	// queueKey is how the store names queue name in its data, the data
	// set included: names of one key are one queue (in Redis, names a
	// brace apart, and a prefix and name a colon apart).
	queueKey(name string) string
	// describe tells where the store's queues live, for the admin API.
	describe() storeDesc
	// open returns the store of queue name and a func that frees what
	// open acquired. It makes no network call.
	open(name string) (fairqueue.Store, func(), error)
}

// newStore resolves a handler's store configuration: a Redis config, or
// none for a queue in this process. It makes no network call; it is the
// one place that decides which kind of store a handler uses.
func newStore(cfg *RedisConfig, repl *caddy.Replacer, log *zap.Logger) (backend, error) {
	if cfg == nil {
		return localBackend{log: log}, nil
	}
	return newRedisBackend(cfg, repl)
}

// localID is the store ID and the data ID of every in-process queue.
const localID = "local"

// localBackend keeps each queue in an in-process store (memstore), one
// per queue name, shared by every engine of that name in the process.
type localBackend struct {
	log *zap.Logger
}

func (localBackend) storeID() string             { return localID }
func (localBackend) dataID() string              { return localID }
func (localBackend) queueKey(name string) string { return localID + "|" + name }
func (localBackend) describe() storeDesc         { return storeDesc{Store: "local"} }

// open returns the memstore of queue name. The store is pooled apart
// from the engines so that an engine retired by a reload, whose last
// requests still hold permits, and the engine that replaces it share one
// store, and so one set of permits.
func (b localBackend) open(name string) (fairqueue.Store, func(), error) {
	v, _, err := localStores.LoadOrNew(name, func() (caddy.Destructor, error) {
		if b.log != nil {
			b.log.Info("queue is local to this instance: its permits and order are not shared with other Caddy instances (add a redis block to share them)",
				zap.String("queue", name))
		}
		return &localStore{Store: memstore.New()}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	release := func() { _, _ = localStores.Delete(name) }
	return v.(*localStore).Store, release, nil
}

// localStores holds one in-process store per queue name, for as long as
// an engine uses it.
var localStores = caddy.NewUsagePool()

// localStore is a pooled memstore.
type localStore struct {
	*memstore.Store
}

// Destruct implements caddy.Destructor; an in-process store holds no
// resource beyond memory.
func (s *localStore) Destruct() error { return nil }
