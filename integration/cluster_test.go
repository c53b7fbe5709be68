package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// proxySite is a site block body: the given directives (fair_queue
// blocks, matchers), then a reverse_proxy to upstream that flushes every
// write, as an LLM proxy must.
func proxySite(upstream string, directives ...string) string {
	return strings.Join(directives, "\n") + fmt.Sprintf(`
	reverse_proxy %s {
		flush_interval -1
	}`, upstream)
}

func TestThreeInstancesShareThePermits(t *testing.T) {
	t.Parallel() // its own Caddy, upstream and Redis: it waits on them, not on the CPU
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 8, Delay: 50 * time.Millisecond})
	// Requests with X-Queue: ordered go to a queue of one permit, whose
	// strictly serial handoffs make the arrival order at the upstream
	// exactly the queue's order.
	site := proxySite(upstream, fmt.Sprintf(`
	@ordered header X-Queue ordered
	@shared not header X-Queue ordered
	fair_queue @shared {
		name shared
		permits 3
		max_wait 60s
		redis {
			url redis://%[1]s/0
		}
	}
	fair_queue @ordered {
		name ordered
		permits 1
		max_wait 60s
		redis {
			url redis://%[1]s/0
		}
	}`, rds.Addr()))
	var caddies []*harness.Caddy
	for i := range 3 {
		caddies = append(caddies, harness.StartCaddy(t, fmt.Sprintf("caddy-%d", i), site, harness.CaddyOptions{}))
	}
	client := newClient(t)
	ctx := context.Background()

	// 30 streaming clients at once, spread over the instances: the
	// upstream must see exactly the 3 permits in use, never more.
	const clients, tokens = 30, 8
	var all collect
	for i := range clients {
		all.send(ctx, client, caddies[i%3].URL(), strconv.Itoa(i), Chat{Stream: true})
	}
	results := all.wait(t, 3*time.Minute)
	require.Len(t, results, clients)
	for name, r := range results {
		requireFullStream(t, r, tokens, "client %s", name)
	}
	assert.Equal(t, 3, mock.MaxInFlight(), "requests at the upstream at once")
	assert.Equal(t, clients, mock.Served())
	shared := Queue{rdb: rds.Client(t), name: "shared"}
	assert.Zero(t, shared.Waiting(t), "tickets left waiting")
	assert.Zero(t, shared.Holders(t), "permits left held")

	// Order across instances: while one stream holds the only permit,
	// clients join the queue one after another on different instances;
	// the upstream must receive them in that order.
	mock.Reset()
	ordered := Queue{rdb: rds.Client(t), name: "ordered"}
	hdr := http.Header{"X-Queue": {"ordered"}}
	holder := holdPermit(t, client, caddies[0].URL(), hdr)
	var waiters collect
	const n = 5
	for i := range n {
		base := caddies[(i+1)%3].URL()
		waiters.send(ctx, client, base, strconv.Itoa(i), Chat{Stream: true, Tokens: 2, Seq: strconv.Itoa(i), Header: hdr})
		// Each joins before the next starts: the order is well defined.
		ordered.awaitWaiting(t, i+1, 10*time.Second)
		time.Sleep(150 * time.Millisecond)
	}
	holder.Release()
	results = waiters.wait(t, time.Minute)
	for i := range n {
		requireFullStream(t, results[strconv.Itoa(i)], 2, "waiter %d", i)
	}
	assert.Equal(t, []string{"0", "1", "2", "3", "4"}, mock.Arrivals(), "arrival order at the upstream")
}
