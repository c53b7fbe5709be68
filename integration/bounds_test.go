package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// memoryKiB reads a field of c's process's /proc/<pid>/status, in KiB:
// VmRSS (resident now) or VmHWM (the peak of VmRSS).
func memoryKiB(t *testing.T, c *harness.Caddy, field string) int {
	t.Helper()
	pid := c.PID()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			require.NoError(t, err, "%s %q", field, v)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// tricklingBody sends a request that declares a body of declared bytes,
// sends its first 12 and then a byte a second (never idle for long,
// never done), and returns what came back: the answer, when it came,
// and whether the server closed the connection after it.
func tricklingBody(addr string, declared int) (resp *http.Response, body []byte, answered time.Time, closed bool, err error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, nil, time.Time{}, false, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		return nil, nil, time.Time{}, false, err
	}
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared)
	if _, err := io.WriteString(conn, head+`{"model":"m"`); err != nil {
		return nil, nil, time.Time{}, false, err
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := io.WriteString(conn, " "); err != nil {
					return
				}
			}
		}
	}()
	br := bufio.NewReader(conn)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, time.Time{}, false, err
	}
	answered = time.Now()
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, time.Time{}, false, err
	}
	// Closed: EOF, or a reset where the server left trickled bytes unread.
	_, err = br.ReadByte()
	return resp, body, answered, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), nil
}

// 200 connections each declare an 8 MiB body, send 12 bytes and then a
// byte a second: Caddy's memory follows the few KB received, not the
// 1.6 GiB declared (before: its RSS grew by 1.6 GiB), and each gets 408
// once body_timeout has passed, its connection closed (before: held as
// long as the client trickled, Caddy's read idle timeout never fired).
// A response that lasts longer than body_timeout is not cut by it.
func TestDeclaredBodiesCostTheBytesSentAndStalledOnesGet408(t *testing.T) {
	const (
		conns    = 200
		declared = 8 << 20
		timeout  = 3 * time.Second
	)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	c := harness.StartCaddy(t, "bodies", proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		body_timeout %s
	}`, timeout)), harness.CaddyOptions{})
	client := newClient(t)
	ctx := context.Background()
	requireFullStream(t, send(ctx, client, c.URL(), Chat{Stream: true}), 2, "before")
	before := memoryKiB(t, c, "VmRSS")

	addr := strings.TrimPrefix(c.URL(), "http://")
	type result struct {
		resp   *http.Response
		body   []byte
		waited time.Duration
		closed bool
		err    error
	}
	results := make([]result, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			start := time.Now()
			resp, body, answered, closed, err := tricklingBody(addr, declared)
			results[i] = result{resp: resp, body: body, waited: answered.Sub(start), closed: closed, err: err}
		})
	}
	wg.Wait()
	peak := memoryKiB(t, c, "VmHWM")

	for i, r := range results {
		require.NoError(t, r.err, "connection %d", i)
		require.Equal(t, http.StatusRequestTimeout, r.resp.StatusCode, "connection %d: %s", i, r.body)
		assert.GreaterOrEqual(t, r.waited, timeout, "connection %d answered before body_timeout", i)
		assert.True(t, r.closed, "connection %d left open", i)
		var e apiError
		require.NoError(t, json.Unmarshal(r.body, &e), "connection %d: %q", i, r.body)
		assert.Equal(t, "request_timeout", e.Error.Code)
	}
	grew := (peak - before) >> 10
	t.Logf("RSS %d MiB before, peak %d MiB: %d MiB for %d x %d MiB declared", before>>10, peak>>10, grew, conns, declared>>20)
	assert.Less(t, grew, 200, "MiB of peak RSS growth for %d connections of 12 bytes", conns)

	// 40 tokens 100ms apart: the stream outlasts body_timeout.
	requireFullStream(t, send(ctx, client, c.URL(), Chat{Stream: true, Tokens: 40, Delay: 100 * time.Millisecond}), 40, "a stream longer than body_timeout")
}

// With the permit held, waiting bodies fill max_waiting_bytes: one more
// is rejected at once with queue_full (JSON, or the SSE event for a
// streaming client), counted in rejects_total; a body that fits still
// waits; once the waiting bodies drain a large one waits again and is
// served.
func TestWaitingBodiesBeyondMaxWaitingBytesGetQueueFullUntilTheyDrain(t *testing.T) {
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	c := harness.StartCaddy(t, "waiting-bytes", proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name bytes
		permits 1
		max_wait 60s
		max_body 16KiB
		max_waiting_bytes 88KiB
		redis redis://%s/0
	}`, rds.Addr())), harness.CaddyOptions{})
	q := Queue{rdb: rds.Client(t), name: "bytes"}
	client := newClient(t)
	ctx := context.Background()
	const large, small = 15000, 2000 // prompt bytes; the bodies are a few bytes more

	holder := holdPermit(t, client, c.URL(), nil)
	a := sendAsync(ctx, client, c.URL(), Chat{Stream: true, PromptBytes: large})
	q.awaitWaiting(t, 1, 10*time.Second)

	requireJSONReject(t, send(ctx, client, c.URL(), Chat{PromptBytes: large}), http.StatusTooManyRequests, "queue_full")
	requireSSEReject(t, send(ctx, client, c.URL(), Chat{Stream: true, PromptBytes: large}), "queue_full")
	assert.Equal(t, 2, sumMetric(scrape(t, c), "caddy_fair_queue_rejects_total", `queue="bytes"`, `reason="queue_full"`))
	fits := sendAsync(ctx, client, c.URL(), Chat{Stream: true, PromptBytes: small})
	q.awaitWaiting(t, 2, 10*time.Second)

	holder.Release()
	requireFullStream(t, await(t, a, 30*time.Second), 2, "the first waiter")
	requireFullStream(t, send(ctx, client, c.URL(), Chat{Stream: true, PromptBytes: large}), 2, "a large body once the waiting ones drained")
	requireFullStream(t, await(t, fits, 30*time.Second), 2, "the body that fitted")
	assert.Equal(t, 0, q.Waiting(t))
}
