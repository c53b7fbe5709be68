package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request heavier than kv_tokens 50 that Redis granted at what it asks
// (70) across a rolling reload to 100 (askedAcrossReload), and Redis
// restarts empty: the heartbeats count the running requests again, that
// one at the 70 it was granted, not at its clamped 50 (else 20 tokens
// more are granted beside it than kv_tokens leaves).
func TestARequestGrantedAtWhatItAsksIsCountedAgainAtThatWeight(t *testing.T) {
	srv := redistest.Start(t)
	const name = "readdasks"
	askedAcrossReload(t, srv, name)
	srv.Restart()
	st := redisstore.New(srv.Client(t), name, redisstore.Options{})
	held := func() int {
		s, err := st.Inspect(context.Background(), 0, 0)
		if err != nil {
			return -1
		}
		return s.TokensHeld
	}
	eventually(t, 20*time.Second, func() bool {
		s, err := st.Inspect(context.Background(), 0, 0)
		return err == nil && len(s.Holders) == 2
	}, "the heartbeats never counted both running requests again")
	if got := held(); got != 80 {
		t.Fatalf("after the restart, the running requests count %d tokens, not the 80 they were granted "+
			"(10, and 70 for the request clamped to 50 by its instance)", got)
	}
}
