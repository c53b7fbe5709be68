package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A reload that removes a queue's pool: the waiters of the pool's config
// are granted permits that name no upstream, which the old route
// (reverse_proxy with dynamic fair_queue) cannot send anywhere. They are
// served by the route of the config in force, and no upstream runs more
// than the permits of the config in force.
func TestReloadThatRemovesAPoolServesItsWaiters(t *testing.T) {
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "local store", true: "redis store"}[redis], func(t *testing.T) {
			store := ""
			if redis {
				rds := redistest.Start(t)
				store = fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", rds.Addr())
			}
			const tokens = 5
			cfg := mockllm.Config{Tokens: tokens, Delay: 60 * time.Millisecond}
			a, b := startReplica(t, cfg), startReplica(t, cfg)
			pooled := fmt.Sprintf(`
	fair_queue {
		name llm
		max_wait 60s
		upstream %s 1
		upstream %s 1
		%s
	}
	reverse_proxy {
		dynamic fair_queue
		flush_interval -1
	}`, a.addr, b.addr, store)
			static := proxySite(a.addr, fmt.Sprintf(`
	fair_queue {
		name llm
		permits 2
		max_wait 60s
		%s
	}`, store))
			c := StartCaddy(t, "caddy", pooled, CaddyOptions{GracePeriod: 30 * time.Second})
			client := newClient(t)
			const clients = 12
			var all collect
			for i := range clients {
				all.send(context.Background(), client, c.URL(), "c"+strconv.Itoa(i), Chat{Stream: true, Seq: "c" + strconv.Itoa(i)})
			}
			require.True(t, eventually(10*time.Second, func() bool {
				return localStats(t, c, "llm").Waiting >= clients-4
			}), "clients not queued: %+v", localStats(t, c, "llm"))

			require.NoError(t, c.Load(static))
			// A client of the new config applies its settings to the queue.
			const later = 4
			for i := range later {
				all.send(context.Background(), client, c.URL(), "n"+strconv.Itoa(i), Chat{Stream: true, Seq: "n" + strconv.Itoa(i)})
			}
			results := all.wait(t, 2*time.Minute)
			require.Len(t, results, clients+later)
			for name, r := range results {
				requireFullStream(t, r, tokens, "client %s", name)
			}
			assert.LessOrEqual(t, a.mock.MaxInFlight(), 2, "replica A at once")
			assert.LessOrEqual(t, b.mock.MaxInFlight(), 1, "replica B at once")
			assert.Equal(t, clients+later, a.mock.Served()+b.mock.Served())
		})
	}
}
