package redisstore_test

import (
	"testing"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The conformance suite on a real redis-server, each node with its own
// client and subscription. Afterwards nothing of any queue is left.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	storetest.Run(t, storetest.Harness{
		NewNode: func(t *testing.T, name string, cfg fairqueue.Config) *fairqueue.Queue {
			return newNode(t, srv, name, cfg).q
		},
		Store: func(t *testing.T, name string) fairqueue.Store {
			return redisstore.New(srv.Client(t), name, redisstore.Options{})
		},
		State: func(t *testing.T, name string) ([]string, []string) {
			st := readState(t, admin, name)
			return st.Waiting, st.Holders
		},
	})
	if keys := srv.Keys(t, "*"); len(keys) > 0 {
		t.Errorf("keys left in Redis after every node closed: %v", keys)
	}
}
