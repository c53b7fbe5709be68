package memstore_test

import (
	"sync"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
)

// The model-based test under faults (storetest.Model) on one in-process
// store shared by every node of a queue. An in-process store does not
// lose its data, so the model does not restart it. Long run: make soak.
func TestModelUnderFaults(t *testing.T) {
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
	storetest.Model(t, storetest.ModelHarness{
		NewStore: func(name string) (fairqueue.Store, func()) { return store(name), nil },
		Leftovers: func(name string) ([]string, error) {
			st := store(name).State()
			var left []string
			for _, id := range st.Waiting {
				left = append(left, "waiting "+id)
			}
			for _, id := range st.Holders {
				left = append(left, "holder "+id)
			}
			return left, nil
		},
	})
}
