package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md, "Known limits": "An instance that shuts down while
// Redis is frozen or unreachable still answers every waiter
// (shutting_down) and returns within the store's timeouts, but its leave
// does not reach Redis: its entries stay as a killed instance's (its
// permits back within its lease, its waiters dropped when they reach the
// head), and the queue's keys go ... with the leave of the queue's next
// last instance". A stream holds the one permit and three clients wait
// (two plain, one streaming) when Redis freezes (SIGSTOP) and Caddy gets
// SIGTERM: each waiting client gets the documented shutting_down reject
// long before Redis answers again, and the process exits while Redis is
// still frozen. Thawed, Redis still holds the instance's entries; a new
// instance of the queue is served once the old one's lease ends, and its
// exit, the queue's last leave, leaves no key.
func TestSIGTERMOnAFrozenRedisAnswersWaitersAndLeavesTheKeysToTheNextLastLeave(t *testing.T) {
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{})
	const lease = 3 * time.Second
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		max_wait 60s
		lease %s
		redis {
			url redis://%s/0
		}
	}`, lease, rds.Addr()))
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{GracePeriod: time.Second})
	client := newClient(t)
	ctx := context.Background()
	q := Queue{rdb: rds.Client(t), name: "default"}

	// A stream of about 20s holds the permit; 3 clients wait behind it.
	running := sendAsync(ctx, client, c.URL(), Chat{Stream: true, Tokens: 200, Delay: 100 * time.Millisecond})
	q.awaitHolders(t, 1, 10*time.Second)
	var waiters collect
	const n = 3
	for i := range n {
		waiters.send(ctx, client, c.URL(), strconv.Itoa(i), Chat{Stream: i == n-1})
	}
	q.awaitWaiting(t, n, 10*time.Second)

	rds.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rds.Thaw()
		}
	})
	c.Signal(syscall.SIGTERM)
	term := time.Now()
	// Redis stays frozen at least this long: an answer, or an exit, that
	// waited for it would come after.
	const frozenFor = 25 * time.Second
	results := waiters.wait(t, frozenFor)
	for i := range n {
		r := results[strconv.Itoa(i)]
		if i < n-1 {
			requireJSONReject(t, r, http.StatusServiceUnavailable, "shutting_down")
		} else {
			requireSSEReject(t, r, "shutting_down")
		}
		t.Logf("waiter %d answered %v after SIGTERM", i, r.Done.Sub(term))
	}
	select {
	case <-c.Exited():
		t.Logf("Caddy exited %v after SIGTERM, Redis frozen", time.Since(term))
	case <-time.After(frozenFor - time.Since(term)):
		t.Fatal("Caddy did not exit while Redis is frozen")
	}
	await(t, running, time.Minute) // cut at the end of the grace period

	rds.Thaw()
	thawed = true
	assert.NotEmpty(t, rds.Keys(t, "{fair_queue:*"), "the leave reached a frozen Redis")
	next := harness.StartCaddy(t, "next", site, harness.CaddyOptions{})
	served := eventually(3*lease, func() bool {
		r := send(ctx, client, next.URL(), Chat{})
		return r.Err == nil && r.Status == http.StatusOK && r.Header.Get("Fair-Queue-Reason") == ""
	})
	require.True(t, served, "the permit of the instance that exited on a frozen Redis never came back")
	next.Stop()
	assert.Empty(t, rds.Keys(t, "{fair_queue:*"), "keys left after the queue's next last instance left")
}
