package memstore_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
)

func TestConformance(t *testing.T) {
	var mu sync.Mutex
	stores := map[string]*memstore.Store{}
	store := func(name string) *memstore.Store {
		mu.Lock()
		defer mu.Unlock()
		if stores[name] == nil {
			stores[name] = memstore.New()
		}
		return stores[name]
	}
	storetest.Run(t, storetest.Harness{
		NewNode: func(t *testing.T, name string, cfg fairqueue.Config) *fairqueue.Queue {
			cfg.Name = name
			q, err := fairqueue.New(store(name), cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = q.Close() })
			return q
		},
		Store: func(t *testing.T, name string) fairqueue.Store { return store(name) },
		State: func(t *testing.T, name string) ([]string, []string) {
			st := store(name).State()
			return st.Waiting, st.Holders
		},
	})
}
