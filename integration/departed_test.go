package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

const (
	departedClients = 64
	departedPermits = 4
	departedRounds  = 6
	// departedTokens x departedDelay is one answer: short enough that
	// permits change hands during a round, long enough that every holder
	// is mid-stream most of the time.
	departedTokens = 10
	departedDelay  = 40 * time.Millisecond
	// A plain answer comes whole after departedPlainDelay: the upstream
	// runs an aborted plain request that long, whatever the client does.
	departedPlainDelay = 10 * time.Millisecond
)

// departedLoad is what the departing clients send: streams, plain
// requests, or both (even clients stream, odd ones do not).
type departedLoad string

const (
	loadStreamed departedLoad = "streamed"
	loadPlain    departedLoad = "plain"
	loadMixed    departedLoad = "mixed"
)

// chat is client i's request under the load.
func (l departedLoad) chat(i int, seq string) Chat {
	if l == loadStreamed || (l == loadMixed && i%2 == 0) {
		return Chat{Stream: true, Seq: seq}
	}
	return Chat{Tokens: 1, Delay: departedPlainDelay, Seq: seq}
}

// Every client leaves at the same instant, holders mid-stream and
// waiters queued behind them: the permits the holders free go to waiters
// whose clients are gone too, and none of those may reach the upstream,
// though Caddy sees the 64 connections close milliseconds apart.
// The upstream notices a departed holder only at its next token (as a
// model server that learns of a closed connection from a failed write),
// or, answering a plain request, not before the answer is written, so
// each aborted holder still runs there when its permit is handed on: a
// departed grantee forwarded then makes more than permits run at once.
// reverse_proxy ends an aborted plain request without an error (it
// writes a 499), an aborted stream with a panic: both must count as
// aborted.
func TestDepartedClientsNeverReachTheUpstream(t *testing.T) {
	type store struct {
		name  string
		redis bool
	}
	for _, tc := range []struct {
		store
		load departedLoad
	}{
		{store{"local store", false}, loadStreamed},
		{store{"local store", false}, loadPlain},
		{store{"local store", false}, loadMixed},
		{store{"redis store", true}, loadStreamed},
		{store{"redis store", true}, loadPlain},
		{store{"redis store", true}, loadMixed},
	} {
		t.Run(tc.name+"/"+string(tc.load), func(t *testing.T) {
			store := ""
			if tc.redis {
				rds := redistest.Start(t)
				store = fmt.Sprintf(`
		redis {
			url redis://%s/0
		}`, rds.Addr())
			}
			mock, upstream := startLateNoticingMockLLM(t, mockllm.Config{Tokens: departedTokens, Delay: departedDelay})
			c := harness.StartCaddy(t, "caddy", proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits %d
		max_wait 60s%s
	}`, departedPermits, store)), harness.CaddyOptions{})
			client := newClient(t)

			var peaks []int
			for round := range departedRounds {
				// The last round's aborted requests have ended upstream.
				require.True(t, eventually(10*time.Second, func() bool { return mock.InFlight() == 0 }),
					"round %d: %d requests still running upstream", round, mock.InFlight())
				mock.Reset()

				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for i := range departedClients {
					wg.Go(func() {
						for n := 0; ctx.Err() == nil; n++ {
							send(ctx, client, c.URL(), tc.load.chat(i, fmt.Sprintf("r%d-c%d-%d", round, i, n)))
						}
					})
				}
				// Permits have changed hands, every client is queued or
				// served (a few may be between two requests), and the
				// permits are streaming.
				queued := eventually(30*time.Second, func() bool {
					s := localStats(t, c, "default")
					return mock.Served() >= departedPermits && s.Waiting >= departedClients-2*departedPermits &&
						mock.InFlight() == departedPermits
				})
				s := localStats(t, c, "default")
				if !queued {
					cancel()
					wg.Wait()
					t.Fatalf("round %d: no steady load within 30s: %d waiting, %d in flight upstream, %d served", round, s.Waiting, mock.InFlight(), mock.Served())
				}
				cancel()
				wg.Wait()
				require.True(t, eventually(10*time.Second, func() bool { return mock.InFlight() == 0 }),
					"round %d: %d requests still running upstream 10s after their clients left", round, mock.InFlight())
				peaks = append(peaks, mock.MaxInFlight())
				t.Logf("round %d: %d waiting when all left; upstream peak %d, %d served, %d cancelled",
					round, s.Waiting, mock.MaxInFlight(), mock.Served(), mock.Canceled())
			}
			t.Logf("upstream peak per round: %v", peaks)
			for round, peak := range peaks {
				assert.LessOrEqual(t, peak, departedPermits, "round %d: requests at once upstream", round)
			}
			// Nothing is left held or waiting.
			assert.True(t, eventually(5*time.Second, func() bool {
				s := localStats(t, c, "default")
				return s.Waiting == 0 && s.InFlight == 0
			}), "queue not empty after the clients left: %+v", localStats(t, c, "default"))
		})
	}
}

// startLateNoticingMockLLM is StartMockLLM with an upstream that does not
// watch its connection: it notices a client that left only when it next
// writes to it.
func startLateNoticingMockLLM(t *testing.T, cfg mockllm.Config) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(cfg)
	h := m.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	}))
	t.Cleanup(srv.Close)
	return m, strings.TrimPrefix(srv.URL, "http://")
}

// queueStats is this instance's view of a queue, from its admin API.
type queueStats struct {
	Waiting  int `json:"waiting"`
	InFlight int `json:"in_flight"`
}

// localStats returns c's own view of queue name, for the local store as
// for Redis.
func localStats(t *testing.T, c *harness.Caddy, name string) queueStats {
	t.Helper()
	status, body := getBody(t, c.AdminURL()+"/fair_queue/")
	require.Equal(t, http.StatusOK, status, "admin: %s", body)
	var rep struct {
		Queues []struct {
			Name  string      `json:"name"`
			Stats *queueStats `json:"stats"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &rep), "admin: %s", body)
	for _, q := range rep.Queues {
		if q.Name == name && q.Stats != nil {
			return *q.Stats
		}
	}
	t.Fatalf("no stats of queue %q: %s", name, body)
	return queueStats{}
}
