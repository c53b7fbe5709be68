package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// TestTenantFairnessAndQueueCapOnTheLocalStore runs one Caddy with no
// Redis: both queues live in the process.
func TestTenantFairnessAndQueueCapOnTheLocalStore(t *testing.T) {
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2, Delay: 10 * time.Millisecond})
	site := proxySite(upstream, `
	@capped header X-Queue capped
	@fair not header X-Queue capped
	fair_queue @fair {
		name fair
		permits 1
		max_wait 2m
		tenant {http.request.header.X-Tenant}
	}
	fair_queue @capped {
		name capped
		permits 1
		max_wait 2m
		max_queue 5
	}`)
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)
	ctx := context.Background()

	t.Run("a light tenant overtakes a heavy tenant's backlog", func(t *testing.T) {
		heavy := http.Header{"X-Tenant": {"heavy"}}
		// The heavy tenant holds the only permit and queues 20 streams.
		holder := holdPermit(t, client, c.URL(), heavy)
		mock.Reset()
		const flood = 20
		var all collect
		for i := range flood {
			seq := "heavy-" + strconv.Itoa(i)
			all.send(ctx, client, c.URL(), seq, Chat{Stream: true, Seq: seq, Header: heavy})
			// One at a time, so that the heavy tenant's order is defined.
			awaitLocalWaiting(t, c, "fair", i+1, 10*time.Second)
		}
		all.send(ctx, client, c.URL(), "light", Chat{Stream: true, Seq: "light", Header: http.Header{"X-Tenant": {"light"}}})
		awaitLocalWaiting(t, c, "fair", flood+1, 10*time.Second)

		holder.Release()
		results := all.wait(t, 2*time.Minute)
		require.Len(t, results, flood+1)
		for name, r := range results {
			requireFullStream(t, r, 2, "client %s", name)
		}
		arrivals := mock.Arrivals()
		require.Len(t, arrivals, flood+1, "arrivals at the upstream: %v", arrivals)
		light := slices.Index(arrivals, "light")
		assert.LessOrEqual(t, light, 1, "the light tenant's request is served within 2 grants: %v", arrivals)
		var heavyOrder []string
		for _, a := range arrivals {
			if strings.HasPrefix(a, "heavy-") {
				heavyOrder = append(heavyOrder, a)
			}
		}
		want := make([]string, flood)
		for i := range want {
			want[i] = "heavy-" + strconv.Itoa(i)
		}
		assert.Equal(t, want, heavyOrder, "FIFO inside a tenant")
	})

	t.Run("max_queue rejects at once with 429 queue_full and Retry-After", func(t *testing.T) {
		capped := http.Header{"X-Queue": {"capped"}}
		holder := holdPermit(t, client, c.URL(), capped)
		const maxQueue = 5
		var waiters collect
		for i := range maxQueue {
			waiters.send(ctx, client, c.URL(), strconv.Itoa(i), Chat{Stream: true, Header: capped})
		}
		awaitLocalWaiting(t, c, "capped", maxQueue, 10*time.Second)

		start := time.Now()
		r := send(ctx, client, c.URL(), Chat{Header: capped})
		requireJSONReject(t, r, http.StatusTooManyRequests, "queue_full")
		assert.Less(t, time.Since(start), 2*time.Second, "a full queue answers at once")
		sse := send(ctx, client, c.URL(), Chat{Stream: true, Header: capped})
		requireSSEReject(t, sse, "queue_full")

		holder.Release()
		results := waiters.wait(t, time.Minute)
		for name, r := range results {
			requireFullStream(t, r, 2, "waiter %s", name)
		}
	})
}

// awaitLocalWaiting waits until queue has n requests waiting on c, as
// its admin API reports (a local queue has no Redis to look into).
func awaitLocalWaiting(t *testing.T, c *harness.Caddy, queue string, n int, d time.Duration) {
	t.Helper()
	got := -1
	if !eventually(d, func() bool {
		got = localWaiting(t, c, queue)
		return got == n
	}) {
		t.Fatalf("queue %s: %d waiting after %v, want %d", queue, got, d, n)
	}
}

// localWaiting reads the waiters of queue on c from GET /fair_queue/.
func localWaiting(t *testing.T, c *harness.Caddy, queue string) int {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(c.AdminURL() + "/fair_queue/")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var status struct {
		Queues []struct {
			Name  string `json:"name"`
			Stats *struct {
				Waiting int `json:"waiting"`
			} `json:"stats"`
		} `json:"queues"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&status))
	n := 0
	for _, q := range status.Queues {
		if q.Name == queue && q.Stats != nil {
			n += q.Stats.Waiting
		}
	}
	return n
}
