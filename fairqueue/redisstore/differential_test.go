package redisstore_test

import (
	"testing"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The in-process store and the Redis store, driven by one node through
// the same calls, make the same grants in the same order
// (storetest.Differential).
func TestStoresServeTheSameOrder(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.Differential(t,
		storetest.DiffStore{Name: "memstore", Open: func(string) fairqueue.Store { return memstore.New() }},
		storetest.DiffStore{Name: "redis", Open: func(name string) fairqueue.Store {
			return redisstore.New(rdb, name, redisstore.Options{})
		}})
}
