package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// requestTimeout bounds every client request, as a safety net: tests
// assert their own, shorter bounds.
const requestTimeout = 2 * time.Minute

// Chat is one chat completion request of a test client.
type Chat struct {
	// Stream asks for a streamed answer ("stream": true in the body).
	Stream bool
	// Accept is the Accept header, if any.
	Accept string
	// Tokens and Delay shape the mock's answer (X-Mock-Tokens,
	// X-Mock-Delay); zero means the mock's defaults.
	Tokens int
	Delay  time.Duration
	// Seq names the request in the mock's Arrivals (X-Client-Seq).
	Seq string
	// PromptBytes pads the prompt to at least this many bytes.
	PromptBytes int
	// Header holds more request headers.
	Header http.Header
}

func (ch Chat) body() string {
	prompt := "Say hello."
	if n := ch.PromptBytes - len(prompt); n > 0 {
		prompt += strings.Repeat("x", n)
	}
	msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": prompt}})
	return fmt.Sprintf(`{"model":"mock","messages":%s,"stream":%t}`, msgs, ch.Stream)
}

// request builds the POST /v1/chat/completions of ch to base.
func (ch Chat) request(ctx context.Context, base string) *http.Request {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(ch.body()))
	if err != nil {
		panic(err) // cannot happen: the URL is ours
	}
	req.Header.Set("Content-Type", "application/json")
	if ch.Accept != "" {
		req.Header.Set("Accept", ch.Accept)
	}
	if ch.Tokens != 0 {
		req.Header.Set(mockllm.HeaderTokens, strconv.Itoa(ch.Tokens))
	}
	if ch.Delay != 0 {
		req.Header.Set(mockllm.HeaderDelay, ch.Delay.String())
	}
	if ch.Seq != "" {
		req.Header.Set(mockllm.HeaderClientSeq, ch.Seq)
	}
	for k, vs := range ch.Header {
		req.Header[k] = vs
	}
	return req
}

// Result is what a client got: the response read in full, or an error.
type Result struct {
	Status int
	Header http.Header
	Body   string
	Err    error
	// Done is when the response was read in full (or failed).
	Done time.Time
}

func (r Result) String() string {
	if r.Err != nil {
		return "error: " + r.Err.Error()
	}
	return fmt.Sprintf("%d %s reason=%q body=%q", r.Status, r.Header.Get("Content-Type"), r.Header.Get("Fair-Queue-Reason"), r.Body)
}

// newClient returns an HTTP/1.1 client that opens a connection per
// request: a cancelled request closes its connection, as a departing
// client does, and no request rides on a connection of a server that a
// reload is shutting down.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// send sends ch to base and reads the whole response.
func send(ctx context.Context, client *http.Client, base string, ch Chat) Result {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := client.Do(ch.request(ctx, base))
	if err != nil {
		return Result{Err: err, Done: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err, Done: time.Now()}
}

// sendAsync sends ch in a goroutine; the channel yields its Result.
func sendAsync(ctx context.Context, client *http.Client, base string, ch Chat) <-chan Result {
	out := make(chan Result, 1)
	go func() { out <- send(ctx, client, base, ch) }()
	return out
}

// await returns the result of a sendAsync, failing the test if none
// comes within d.
func await(t *testing.T, ch <-chan Result, d time.Duration) Result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("no response within %v", d)
		return Result{}
	}
}

// Holder is a long streaming request that holds a permit until
// released.
type Holder struct {
	cancel context.CancelFunc
	result <-chan Result
	once   sync.Once
}

// holdPermit sends a streaming request of about a hundred seconds and
// returns once its answer has started: it holds a permit. Release ends
// it.
func holdPermit(t *testing.T, client *http.Client, base string, header http.Header) *Holder {
	t.Helper()
	return hold(t, client, base, header, false)
}

// holdPermitAcrossSwap is holdPermit for a request sent right after a
// reload: a connection the listener swap resets before any answer is
// sent again once, as sendAcrossSwap does.
func holdPermitAcrossSwap(t *testing.T, client *http.Client, base string, header http.Header) *Holder {
	t.Helper()
	return hold(t, client, base, header, true)
}

// hold is holdPermit; acrossSwap sends the request again once if the
// listener swap of a reload reset its connection.
func hold(t *testing.T, client *http.Client, base string, header http.Header, acrossSwap bool) *Holder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan Result, 1)
	result := make(chan Result, 1)
	go func() {
		ch := Chat{Stream: true, Tokens: 1000, Delay: 100 * time.Millisecond, Header: header}
		resp, err := client.Do(ch.request(ctx, base))
		if err != nil && acrossSwap && swapReset(err) {
			resp, err = client.Do(ch.request(ctx, base))
		}
		if err != nil {
			started <- Result{Err: err}
			result <- Result{Err: err}
			return
		}
		defer resp.Body.Close()
		started <- Result{Status: resp.StatusCode, Header: resp.Header}
		b, err := io.ReadAll(resp.Body)
		result <- Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err, Done: time.Now()}
	}()
	h := &Holder{cancel: cancel, result: result}
	t.Cleanup(h.Release)
	r := await(t, started, 30*time.Second)
	require.NoError(t, r.Err, "holding request")
	require.Equal(t, http.StatusOK, r.Status, "holding request: %s", r)
	require.Empty(t, r.Header.Get("Fair-Queue-Reason"), "holding request was rejected")
	return h
}

// Release ends the holding request, which gives its permit back, and
// waits until the client has seen the end.
func (h *Holder) Release() {
	h.once.Do(func() {
		h.cancel()
		select {
		case <-h.result:
		case <-time.After(30 * time.Second):
		}
	})
}

// requireFullStream asserts a complete streamed answer of tokens tokens.
func requireFullStream(t *testing.T, r Result, tokens int, msgAndArgs ...any) {
	t.Helper()
	require.NoError(t, r.Err, msgAndArgs...)
	require.Equal(t, http.StatusOK, r.Status, "%s %v", r, msgAndArgs)
	require.Empty(t, r.Header.Get("Fair-Queue-Reason"), msgAndArgs...)
	assert.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream"), "Content-Type %q %v", r.Header.Get("Content-Type"), msgAndArgs)
	assert.Equal(t, tokens, strings.Count(r.Body, "data: {"), "token events %v", msgAndArgs)
	assert.True(t, strings.HasSuffix(r.Body, "data: [DONE]\n\n"), "stream does not end in [DONE]: %q %v", r.Body, msgAndArgs)
}

// apiError is the OpenAI-style error object of a reject.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// requireJSONReject asserts a non-streaming reject: status, reason
// header, Retry-After in whole seconds and the JSON error object.
func requireJSONReject(t *testing.T, r Result, status int, reason string) apiError {
	t.Helper()
	require.NoError(t, r.Err)
	require.Equal(t, status, r.Status, "%s", r)
	assert.Equal(t, reason, r.Header.Get("Fair-Queue-Reason"))
	requireRetryAfter(t, r)
	assert.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), "application/json"), "Content-Type %q", r.Header.Get("Content-Type"))
	var e apiError
	require.NoError(t, json.Unmarshal([]byte(r.Body), &e), "body %q", r.Body)
	assert.Equal(t, reason, e.Error.Code, "body %q", r.Body)
	assert.NotEmpty(t, e.Error.Message, "body %q", r.Body)
	assert.NotEmpty(t, e.Error.Type, "body %q", r.Body)
	return e
}

// requireSSEReject asserts a reject of a streaming request: 200, an SSE
// stream of one "error" event whose data is the JSON error object.
func requireSSEReject(t *testing.T, r Result, reason string) apiError {
	t.Helper()
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status, "%s", r)
	assert.Equal(t, reason, r.Header.Get("Fair-Queue-Reason"))
	requireRetryAfter(t, r)
	assert.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream"), "Content-Type %q", r.Header.Get("Content-Type"))
	const head = "event: error\ndata: "
	require.True(t, strings.HasPrefix(r.Body, head), "body %q", r.Body)
	require.True(t, strings.HasSuffix(r.Body, "\n\n"), "body %q", r.Body)
	data := strings.TrimSuffix(strings.TrimPrefix(r.Body, head), "\n\n")
	require.NotContains(t, data, "\n", "one data line expected: %q", r.Body)
	var e apiError
	require.NoError(t, json.Unmarshal([]byte(data), &e), "data %q", data)
	assert.Equal(t, reason, e.Error.Code, "data %q", data)
	assert.NotEmpty(t, e.Error.Message, "data %q", data)
	return e
}

func requireRetryAfter(t *testing.T, r Result) {
	t.Helper()
	v := r.Header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "Retry-After %q is not whole seconds", v)
	assert.GreaterOrEqual(t, n, 1, "Retry-After %q", v)
}

// Queue inspects a queue's keys in Redis.
type Queue struct {
	rdb  *redis.Client
	name string
}

func (q Queue) key(k string) string { return "{fair_queue:" + q.name + "}:" + k }

func (q Queue) card(t *testing.T, k string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := q.rdb.ZCard(ctx, q.key(k)).Result()
	require.NoError(t, err, "ZCARD %s", q.key(k))
	return int(n)
}

// Waiting returns the number of tickets waiting: the FIFO set and the
// fair tickets.
func (q Queue) Waiting(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := q.rdb.HLen(ctx, q.key("fticket")).Result()
	require.NoError(t, err, "HLEN %s", q.key("fticket"))
	return q.card(t, "waiting") + int(n)
}

// Holders returns the number of permits held.
func (q Queue) Holders(t *testing.T) int { t.Helper(); return q.card(t, "holders") }

// Nodes returns the number of live nodes of the queue.
func (q Queue) Nodes(t *testing.T) int { t.Helper(); return q.card(t, "nodes") }

// awaitWaiting waits until the queue holds n waiting tickets.
func (q Queue) awaitWaiting(t *testing.T, n int, d time.Duration) {
	t.Helper()
	if !eventually(d, func() bool { return q.Waiting(t) == n }) {
		t.Fatalf("queue %s: %d waiting after %v, want %d", q.name, q.Waiting(t), d, n)
	}
}

// awaitHolders waits until n permits of the queue are held.
func (q Queue) awaitHolders(t *testing.T, n int, d time.Duration) {
	t.Helper()
	if !eventually(d, func() bool { return q.Holders(t) == n }) {
		t.Fatalf("queue %s: %d permits held after %v, want %d", q.name, q.Holders(t), d, n)
	}
}

// collect gathers the results of async requests.
type collect struct {
	mu      sync.Mutex
	results map[string]Result
	wg      sync.WaitGroup
}

func (c *collect) send(ctx context.Context, client *http.Client, base, name string, ch Chat) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		r := send(ctx, client, base, ch)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.results == nil {
			c.results = make(map[string]Result)
		}
		c.results[name] = r
	}()
}

// sendStreams sends n streaming chats, c0 to c<n-1> (their names and
// seqs), each with a cancel of its own: the map's, by name.
func (c *collect) sendStreams(client *http.Client, base string, n int) map[string]context.CancelFunc {
	cancels := make(map[string]context.CancelFunc, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		seq := "c" + strconv.Itoa(i)
		cancels[seq] = cancel
		c.send(ctx, client, base, seq, Chat{Stream: true, Seq: seq})
	}
	return cancels
}

// sendAcrossSwap is send for a request sent as a reload swaps Caddy's
// listeners: a connection the swap resets before any answer (Caddy's, not
// the queue's; TestChaos and the reload chaos test allow it too) is sent
// again once, as a client would; nothing of it reached the handler.
func (c *collect) sendAcrossSwap(ctx context.Context, client *http.Client, base, name string, ch Chat) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		r := send(ctx, client, base, ch)
		if r.Status == 0 && swapReset(r.Err) {
			r = send(ctx, client, base, ch)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.results == nil {
			c.results = make(map[string]Result)
		}
		c.results[name] = r
	}()
}

// swapReset reports whether err, a request's error before any answer,
// is a connection that a reload's listener swap reset: the old listener
// closed with the connection still in its backlog, which happens for a
// moment after the admin API has answered the load too.
func swapReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || errors.Is(err, io.EOF))
}

// wait waits for every request and returns the results by name.
func (c *collect) wait(t *testing.T, d time.Duration) map[string]Result {
	t.Helper()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("requests still running after %v", d)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.results
}
