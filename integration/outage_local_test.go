package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
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

// The outage tests' settings: a short lease, so that the instances
// heartbeat every second and soon see each other, and answers of 6
// tokens 40ms apart (about 240ms each).
const (
	outageMaxWait = 4 * time.Second
	outageTokens  = 6
)

// outageQueue is a fair_queue named name in Redis at redisAddr with
// on_store_error local and no local_permits, its other option lines
// (permits, upstreams) given.
func outageQueue(redisAddr, name string, options ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tfair_queue {\n\t\tname %s\n\t\tmax_wait %s\n\t\tlease 3s\n\t\tpoll_interval 100ms\n\t\ton_store_error local\n", name, outageMaxWait)
	for _, o := range options {
		fmt.Fprintf(&b, "\t\t%s\n", o)
	}
	fmt.Fprintf(&b, "\t\tredis {\n\t\t\turl redis://%s/0\n\t\t}\n\t}\n", redisAddr)
	return b.String()
}

// startOutageCluster starts n instances of site, sends one request
// through each, and waits until every instance has seen the n of them
// live in a heartbeat (caddy_fair_queue_cluster_nodes): the share each
// takes of the permits while Redis is down is dealt among those.
func startOutageCluster(t *testing.T, n int, queue, site string) []*harness.Caddy {
	t.Helper()
	var caddies []*harness.Caddy
	for i := range n {
		caddies = append(caddies, harness.StartCaddy(t, fmt.Sprintf("caddy-%d", i), site, harness.CaddyOptions{}))
	}
	client := newClient(t)
	for _, c := range caddies {
		requireFullStream(t, send(context.Background(), client, c.URL(), Chat{Stream: true, Tokens: 1}), 1, "%s with Redis up", c.Name())
	}
	for _, c := range caddies {
		ok := eventually(20*time.Second, func() bool {
			return sumMetric(scrape(t, c), "caddy_fair_queue_cluster_nodes", `queue="`+queue+`"`) == n
		})
		require.True(t, ok, "%s never saw the %d live instances in a heartbeat", c.Name(), n)
	}
	return caddies
}

// timed is a client's result and how long it waited for the answer's
// header (a reject's, or the upstream's once granted).
type timed struct {
	Result
	chat   Chat
	header time.Duration
}

// burst sends perInstance chats through each instance at once, every
// fourth one not streamed, and returns every result.
func burst(t *testing.T, caddies []*harness.Caddy, perInstance int) []timed {
	t.Helper()
	client := newClient(t)
	out := make(chan timed, perInstance*len(caddies))
	for i := range perInstance * len(caddies) {
		ch := Chat{Stream: i%4 != 3, Seq: strconv.Itoa(i)}
		base := caddies[i%len(caddies)].URL()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			start := time.Now()
			resp, err := client.Do(ch.request(ctx, base))
			r := timed{chat: ch, header: time.Since(start)}
			if err != nil {
				r.Result = Result{Err: err, Done: time.Now()}
				out <- r
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			r.Result = Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err, Done: time.Now()}
			out <- r
		}()
	}
	var results []timed
	deadline := time.After(outageMaxWait + time.Minute)
	for range perInstance * len(caddies) {
		select {
		case r := <-out:
			results = append(results, r)
		case <-deadline:
			t.Fatalf("%d of %d clients still without a full answer after %v", perInstance*len(caddies)-len(results),
				perInstance*len(caddies), outageMaxWait+time.Minute)
		}
	}
	return results
}

// requireServedOrRejected asserts that every client got a full answer
// or the documented timeout reject (429 and a JSON error; an SSE error
// event for a stream), its header within max_wait and a margin for a
// loaded machine (the reject comes at max_wait), and returns how many
// were served.
func requireServedOrRejected(t *testing.T, results []timed) int {
	t.Helper()
	served := 0
	for _, r := range results {
		require.NoError(t, r.Err, "client %s", r.chat.Seq)
		assert.Less(t, r.header, outageMaxWait+3*time.Second, "client %s waited past max_wait: %s", r.chat.Seq, r.Result)
		if reason := r.Header.Get("Fair-Queue-Reason"); reason != "" {
			if r.chat.Stream {
				requireSSEReject(t, r.Result, "timeout")
			} else {
				requireJSONReject(t, r.Result, http.StatusTooManyRequests, "timeout")
			}
			continue
		}
		served++
		if r.chat.Stream {
			requireFullStream(t, r.Result, outageTokens, "client %s", r.chat.Seq)
			continue
		}
		require.Equal(t, http.StatusOK, r.Status, "client %s: %s", r.chat.Seq, r.Result)
		var answer struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.Body), &answer), "client %s: %s", r.chat.Seq, r.Result)
		require.Len(t, answer.Choices, 1, "client %s: %s", r.chat.Seq, r.Result)
		assert.NotEmpty(t, answer.Choices[0].Message.Content, "client %s: %s", r.chat.Seq, r.Result)
	}
	return served
}

// localPermits returns the local_permits each instance's fallback queue
// logged when it opened (Redis found down), sorted.
func localPermits(t *testing.T, caddies []*harness.Caddy) []int {
	t.Helper()
	re := regexp.MustCompile(`store unreachable: queueing in this node only[^\n]*"local_permits":(\d+)`)
	var got []int
	for _, c := range caddies {
		m := re.FindStringSubmatch(c.Log())
		require.NotNil(t, m, "%s never opened its local fallback queue", c.Name())
		n, _ := strconv.Atoi(m[1])
		got = append(got, n)
	}
	slices.Sort(got)
	return got
}

// During a Redis outage with on_store_error local, three instances of a
// pool of two replicas (1 and 2 permits) run no replica above its
// permits between them: their fallback queues deal each replica's
// permits among the live instances (1, 1 and 1 here). Every client gets
// a full answer or the timeout reject, none waits past max_wait. Once
// Redis is back (empty), the shared queue takes over: requests are
// granted by Redis, no permit is left held, and no key is left once the
// instances stop.
func TestRedisOutageWithAPoolKeepsEachReplicaWithinItsPermits(t *testing.T) {
	rds := redistest.Start(t)
	permits := []int{1, 2}
	var replicas []*replica
	for range permits {
		replicas = append(replicas, startReplica(t, mockllm.Config{Tokens: outageTokens, Delay: 40 * time.Millisecond}))
	}
	options := []string{}
	for i, r := range replicas {
		options = append(options, fmt.Sprintf("upstream %s %d", r.addr, permits[i]))
	}
	site := outageQueue(rds.Addr(), "pool", options...) + "\treverse_proxy {\n\t\tdynamic fair_queue\n\t\tflush_interval -1\n\t}"
	caddies := startOutageCluster(t, 3, "pool", site)
	for _, r := range replicas {
		r.mock.Reset()
	}

	rds.Kill()
	results := burst(t, caddies, 8)
	served := requireServedOrRejected(t, results)
	total := 0
	for i, r := range replicas {
		t.Logf("outage: replica %d (permits %d): served %d, at most %d at once", i, permits[i], r.mock.Served(), r.mock.MaxInFlight())
		assert.LessOrEqual(t, r.mock.MaxInFlight(), permits[i], "replica %d (permits %d) ran more at once during the outage", i, permits[i])
		assert.Positive(t, r.mock.Served(), "replica %d served nothing during the outage", i)
		total += r.mock.Served()
	}
	assert.Equal(t, served, total, "answers served against requests the replicas answered")
	assert.Positive(t, served, "nothing served during the outage")
	assert.Equal(t, []int{1, 1, 1}, localPermits(t, caddies), "each instance's part of the 3 permits")

	// Redis is back, empty: every instance joins again, and the shared
	// queue grants the requests.
	rds.Restart()
	q := Queue{rdb: rds.Client(t), name: "pool"}
	require.True(t, eventually(20*time.Second, func() bool { return q.Nodes(t) == 3 }), "the instances never joined the restarted Redis")
	for _, c := range caddies {
		// Its fallback queue retired (its waiters moved, its permits
		// counted in Redis) and closed once its last permit ended.
		ok := eventually(20*time.Second, func() bool {
			return strings.Contains(c.Log(), `"msg":"node left queue","queue":"pool (local fallback)"`)
		})
		require.True(t, ok, "%s still serves from its fallback queue", c.Name())
		assert.Equal(t, 1, sumMetric(scrape(t, c), "caddy_fair_queue_store_up", `queue="pool"`), "%s: store_up", c.Name())
	}
	for _, r := range replicas {
		r.mock.Reset()
	}
	results = burst(t, caddies, 4)
	served = requireServedOrRejected(t, results)
	assert.Equal(t, len(results), served, "every request served once Redis is back")
	for i, r := range replicas {
		assert.LessOrEqual(t, r.mock.MaxInFlight(), permits[i], "replica %d (permits %d) ran more at once after the outage", i, permits[i])
	}
	assert.Equal(t, int64(served), redisGrants(t, caddies[0], "pool"), "requests Redis granted once back")
	q.awaitWaiting(t, 0, 10*time.Second)
	q.awaitHolders(t, 0, 10*time.Second)
	for _, c := range caddies {
		c.Stop()
	}
	assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis after every instance stopped")
}

// Without a pool, permits 5 over three instances are dealt 2, 2 and 1
// while Redis is down: the instances together run 5 requests at once,
// never more.
func TestRedisOutageDealsThePermitsAmongTheInstances(t *testing.T) {
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: outageTokens, Delay: 40 * time.Millisecond})
	site := proxySite(upstream, outageQueue(rds.Addr(), "dealt", "permits 5"))
	caddies := startOutageCluster(t, 3, "dealt", site)
	mock.Reset()

	rds.Kill()
	results := burst(t, caddies, 8)
	served := requireServedOrRejected(t, results)
	t.Logf("outage: served %d, at most %d at once", mock.Served(), mock.MaxInFlight())
	assert.Equal(t, served, mock.Served(), "answers served against requests the upstream answered")
	assert.Equal(t, []int{1, 2, 2}, localPermits(t, caddies), "each instance's part of the 5 permits")
	assert.LessOrEqual(t, mock.MaxInFlight(), 5, "the upstream ran more than the permits during the outage")
}

// redisGrants is the queue's grant counter in Redis (the admin API's
// snapshot, read from the store by c).
func redisGrants(t *testing.T, c *harness.Caddy, queue string) int64 {
	t.Helper()
	resp, err := http.Get(c.AdminURL() + "/fair_queue/")
	require.NoError(t, err)
	defer resp.Body.Close()
	var list struct {
		Queues []struct {
			Name     string `json:"name"`
			Snapshot *struct {
				Grants int64 `json:"grants"`
			} `json:"snapshot"`
			Error string `json:"error"`
		} `json:"queues"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	for _, q := range list.Queues {
		if q.Name == queue {
			require.NotNil(t, q.Snapshot, "no snapshot of %s: %s", queue, q.Error)
			return q.Snapshot.Grants
		}
	}
	t.Fatalf("queue %s not in the admin API of %s", queue, c.Name())
	return 0
}
