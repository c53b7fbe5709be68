package redisstore_test

import (
	"sync"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The in-process store and the Redis store, driven by two nodes through
// the same calls, make the same grants in the same order
// (storetest.Differential). Each node has a handle of its own on one
// queue: one in-process store per queue name, Redis handles on one
// client.
func TestStoresServeTheSameOrder(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var mu sync.Mutex
	mem := map[string]*memstore.Store{}
	storetest.Differential(t,
		storetest.DiffStore{Name: "memstore", Open: func(name string) fairqueue.Store {
			mu.Lock()
			defer mu.Unlock()
			if mem[name] == nil {
				mem[name] = memstore.New()
			}
			return mem[name]
		}},
		storetest.DiffStore{Name: "redis", Open: func(name string) fairqueue.Store {
			return redisstore.New(rdb, name, redisstore.Options{})
		}})
}
