package caddyfairqueue

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

func TestCaddyfileCostModes(t *testing.T) {
	for _, tc := range []struct {
		line    string
		cost    string
		maxCost int
		// after setDefaults
		defaultMax int
	}{
		{"cost requests", CostRequests, 0, 0},
		{"cost max_tokens", CostMaxTokens, 0, DefaultMaxCost},
		{"cost max_tokens 4096", CostMaxTokens, 4096, 4096},
		{"cost time", CostTime, 0, 0},
		{"cost tokens", CostTokens, 0, DefaultMaxCost},
		{"cost tokens 100000", CostTokens, 100000, 100000},
	} {
		t.Run(tc.line, func(t *testing.T) {
			h, err := parse("fair_queue {\npermits 2\ntenant {http.request.remote.host}\n" + tc.line + "\n}")
			require.NoError(t, err)
			assert.Equal(t, tc.cost, h.Cost)
			assert.Equal(t, tc.maxCost, h.MaxCost)
			h.setDefaults()
			assert.Equal(t, tc.defaultMax, h.MaxCost)
			require.NoError(t, h.validate())
		})
	}
	h, err := parse("fair_queue {\npermits 2\ntenant x\n}")
	require.NoError(t, err)
	assert.Empty(t, h.Cost, "no cost: requests, the engine's default of 1")

	h, err = parse("fair_queue {\npermits 4\npriority {http.request.header.X-Priority}\nmax_in_flight_per_tenant 2\n}")
	require.NoError(t, err, "priority alone makes the queue fair")
	assert.Equal(t, 2, h.MaxInFlightPerTenant)
	assert.Equal(t, 2, h.settings().config().MaxInFlightPerTenant, "passed to the engine")
}

func TestCaddyfileCostErrorsNameTheLine(t *testing.T) {
	for input, line := range map[string]string{
		"fair_queue {\n\tpermits 1\n\ttenant x\n\tcost time 5\n}":                 "Testfile:4",
		"fair_queue {\n\tpermits 1\n\ttenant x\n\n\tcost bytes\n}":                "Testfile:5",
		"fair_queue {\n\tpermits 1\n\ttenant x\n\tmax_in_flight_per_tenant -1\n}": "Testfile:4",
	} {
		_, err := parse(input)
		require.Error(t, err, input)
		assert.Contains(t, err.Error(), line, input)
	}
}

func TestSettingsDifferInMaxInFlight(t *testing.T) {
	a := (&Handler{Permits: 1, Tenant: "x", MaxInFlightPerTenant: 1}).settings()
	b := (&Handler{Permits: 1, Tenant: "x", MaxInFlightPerTenant: 2}).settings()
	assert.Equal(t, "max_in_flight_per_tenant (1 and 2)", a.diff(b))
}

func TestTokensEstimateIsTheWeight(t *testing.T) {
	for _, tc := range []struct {
		name           string
		prompt, budget int64
		maxCost        int
		want           float64
	}{
		{"prompt estimate plus budget", 3, 100, 1000, 103},
		{"bounded to max", 900, 512, 1000, 1000},
		{"at least 1", 0, 0, DefaultMaxCost, 1},
		{"a max of 1", 5, 5, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tokensEstimate(weight{prompt: tc.prompt, budget: tc.budget}, tc.maxCost))
		})
	}
	// Through the handler: the body as read, its prompt estimated with
	// the queue's bytes per token once the request enters the queue.
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "cost-estimate", Permits: 1, Tenant: "{http.request.header.X-Tenant}", Cost: CostTokens, MaxCost: 5000})
	charge := func(body string) float64 {
		t.Helper()
		req, _ := resolve(h, body)
		c := &call{h: h, name: "cost-estimate", own: okHandler, req: req,
			weight: newWeight(jsonscan.Sniff([]byte(body)), apiOpenAI, len(body), h.defaultMaxTokens(), h.mediaTokens())}
		require.NoError(t, c.enter())
		defer c.done()
		return c.req.Cost
	}
	body := `{"max_tokens":256,"messages":[{"role":"user","content":"` + strings.Repeat("a", 1000) + `"}]}`
	assert.Equal(t, float64(1000/4+256), charge(body))
	assert.Equal(t, float64(0+DefaultMaxTokens), charge(`{"messages":[]}`), "no budget: default_max_tokens")
	assert.Equal(t, 5000.0, charge(`{"max_completion_tokens":9000}`), "bounded to max_cost")
	engine := h.engineList()[0]
	for range 1000 {
		engine.kv.observe(2000, 1000) // 2 bytes per token
	}
	assert.InDelta(t, float64(1000/2+256), charge(body), 1, "the queue's learned ratio")
}

func TestHoldAverage(t *testing.T) {
	var a holdAverage
	assert.Equal(t, 1.0, a.estimate(), "seed: 1s")
	a.observe(0.5)
	assert.InDelta(t, 0.9, a.estimate(), 1e-12) // 1 + 0.2*(0.5-1)
	a.observe(2)
	assert.InDelta(t, 1.12, a.estimate(), 1e-12) // 0.9 + 0.2*(2-0.9)
	a.observe(math.NaN())
	a.observe(-1)
	a.observe(math.Inf(1))
	assert.InDelta(t, 1.12, a.estimate(), 1e-12, "invalid holds are ignored")

	var z holdAverage
	for range 5000 {
		z.observe(0)
	}
	assert.Equal(t, minHoldEstimate, z.estimate(), "never 0, which the engine would read as 1")

	var b holdAverage
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				b.observe(3)
				_ = b.estimate()
			}
		})
	}
	wg.Wait()
	assert.InDelta(t, 3, b.estimate(), 1e-9, "8000 holds of 3s: the average is 3s")

	h := fairHandler(t, &Handler{Tenant: "x", Cost: CostTime})
	h.hold.observe(4)
	got, _ := resolve(h, `{}`)
	assert.InDelta(t, 1.6, got.Cost, 1e-12, "cost time is charged the average at the grant")
}

// usageOf writes the chunks as a response with the given Content-Type
// through a usageWriter, and returns what it found and what the client got.
func usageOf(t *testing.T, contentType string, chunks ...string) (float64, bool, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	u := newUsageWriter(rec)
	if contentType != "" {
		u.Header().Set("Content-Type", contentType)
	}
	u.WriteHeader(http.StatusOK)
	for _, c := range chunks {
		n, err := u.Write([]byte(c))
		require.NoError(t, err)
		require.Equal(t, len(c), n)
	}
	total, ok := u.totalTokens()
	require.Equal(t, strings.Join(chunks, ""), rec.Body.String(), "the response passes unchanged")
	return total, ok, rec.Body.String()
}

func TestUsageFromAJSONBody(t *testing.T) {
	body := `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`
	total, ok, _ := usageOf(t, "application/json; charset=utf-8", body[:20], body[20:70], body[70:])
	assert.True(t, ok)
	assert.Equal(t, 42.0, total)

	_, ok, _ = usageOf(t, "application/json", `{"usage":null}`)
	assert.False(t, ok, "null usage")
	_, ok, _ = usageOf(t, "application/json", `{"usage":{"prompt_tokens":3}}`)
	assert.False(t, ok, "no total_tokens")
	_, ok, _ = usageOf(t, "application/json", `{"usage":{"total_tokens":-3}}`)
	assert.False(t, ok, "a negative total")
	_, ok, _ = usageOf(t, "application/json", `{"usage":{"total_tokens":42}`)
	assert.False(t, ok, "cut JSON")
	_, ok, _ = usageOf(t, "text/plain", body)
	assert.False(t, ok, "not JSON by its Content-Type")
	_, ok, _ = usageOf(t, "", body)
	assert.False(t, ok, "no Content-Type")

	total, ok, _ = usageOf(t, "application/json", `{"object":"response","response":{"usage":{"input_tokens":5,"output_tokens":6,"total_tokens":11}}}`)
	assert.True(t, ok, "Responses API")
	assert.Equal(t, 11.0, total)

	// Beyond 1 MiB the body is not kept: no usage, and no memory held.
	pad := `{"pad":"` + strings.Repeat("x", maxJSONBody) + `",`
	rec := httptest.NewRecorder()
	u := newUsageWriter(rec)
	u.Header().Set("Content-Type", "application/json")
	for i := 0; i < len(pad); i += 4096 {
		_, _ = u.Write([]byte(pad[i:min(i+4096, len(pad))]))
	}
	assert.Nil(t, u.body, "given up: the buffer is dropped")
	_, _ = u.Write([]byte(`"usage":{"total_tokens":42}}`))
	_, ok = u.totalTokens()
	assert.False(t, ok)
	assert.Equal(t, len(pad)+28, rec.Body.Len(), "every byte still reached the client")

	// A compressed body cannot be read.
	rec = httptest.NewRecorder()
	u = newUsageWriter(rec)
	u.Header().Set("Content-Type", "application/json")
	u.Header().Set("Content-Encoding", "gzip")
	_, _ = u.Write([]byte(body))
	_, ok = u.totalTokens()
	assert.False(t, ok)
}

func TestUsageFromTheLastSSEChunkWithUsage(t *testing.T) {
	stream := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"total_tokens\":10}}\n\n", // vLLM continuous usage
		": a comment with \"total_tokens\":99\n\n",
		"event: message\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":17,\"total_tokens\":37}}\n\n",
		"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n", // null after: the last non-null counts
		"data: [DONE]\n\n",
	}
	total, ok, _ := usageOf(t, "text/event-stream", stream...)
	assert.True(t, ok)
	assert.Equal(t, 37.0, total)

	// The same, one byte per write: lines split anywhere.
	all := strings.Join(stream, "")
	bytewise := make([]string, len(all))
	for i := range all {
		bytewise[i] = all[i : i+1]
	}
	total, ok, _ = usageOf(t, "text/event-stream; charset=utf-8", bytewise...)
	assert.True(t, ok)
	assert.Equal(t, 37.0, total)

	// CRLF line ends, a data field without its space, and a last line
	// without its newline.
	total, ok, _ = usageOf(t, "text/event-stream", "data: {\"a\":1}\r\n\r\ndata:{\"usage\":{\"total_tokens\":", "5}}")
	assert.True(t, ok)
	assert.Equal(t, 5.0, total)

	// Responses API: response.completed carries response.usage.
	total, ok, _ = usageOf(t, "text/event-stream",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":2,\"total_tokens\":6}}}\n\n")
	assert.True(t, ok)
	assert.Equal(t, 6.0, total)
}

func TestUsageAbsentFromAnSSEStream(t *testing.T) {
	_, ok, _ := usageOf(t, "text/event-stream",
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n",
		"data: [DONE]\n\n")
	assert.False(t, ok)
	_, ok, _ = usageOf(t, "application/json", "data: {\"usage\":{\"total_tokens\":5}}\n\n")
	assert.False(t, ok, "SSE is read only with its Content-Type")
}

func TestUsageSkipsAnOversizedSSELineWithoutUsageInItsTail(t *testing.T) {
	huge := "data: {\"usage\":{\"total_tokens\":99},\"pad\":\"" + strings.Repeat("x", maxSSELine) + "\"}\n\n"
	rec := httptest.NewRecorder()
	u := newUsageWriter(rec)
	u.Header().Set("Content-Type", "text/event-stream")
	for i := 0; i < len(huge); i += 1000 {
		_, _ = u.Write([]byte(huge[i:min(i+1000, len(huge))]))
		assert.LessOrEqual(t, cap(u.line), 2*maxSSELine, "the line buffer is bounded")
	}
	_, ok := u.totalTokens()
	assert.False(t, ok, "the usage is beyond the tail read: the line gives none")
	assert.Equal(t, len(huge), rec.Body.Len())

	// The lines after it are read again.
	_, _ = u.Write([]byte("data: {\"usage\":{\"total_tokens\":7}}\n\n"))
	total, ok := u.totalTokens()
	assert.True(t, ok)
	assert.Equal(t, 7.0, total)

	// A line just at the bound is read.
	pad := maxSSELine - len(`data: {"p":"","usage":{"total_tokens":8}}`)
	total, ok, _ = usageOf(t, "text/event-stream", `data: {"p":"`+strings.Repeat("y", pad)+`","usage":{"total_tokens":8}}`+"\n")
	assert.True(t, ok)
	assert.Equal(t, 8.0, total)
}

func TestUsageWriterKeepsFlushAndReadFrom(t *testing.T) {
	rec := httptest.NewRecorder()
	u := newUsageWriter(rec)
	u.Header().Set("Content-Type", "text/event-stream")
	_, _ = u.Write([]byte("data: {}\n\n"))
	require.NoError(t, http.NewResponseController(u).Flush())
	assert.True(t, rec.Flushed, "Flush reaches the writer beneath")
	assert.Same(t, rec, u.Unwrap().(*httptest.ResponseRecorder))

	// ReadFrom (io.Copy's path when the reader has no WriteTo): the
	// bytes are read for usage all the same.
	event := "data: {\"usage\":{\"total_tokens\":3}}\n\n"
	n, err := u.ReadFrom(io.MultiReader(strings.NewReader(event)))
	require.NoError(t, err)
	assert.EqualValues(t, len(event), n)
	assert.Equal(t, "data: {}\n\n"+event, rec.Body.String())
	total, ok := u.totalTokens()
	assert.True(t, ok)
	assert.Equal(t, 3.0, total)
}

// costHandler is a local queue of one permit with the given cost mode,
// whose Permit.Charge calls are sent on the returned channel.
func costHandler(t *testing.T, name, cost string, h *Handler) (*Handler, chan float64) {
	t.Helper()
	h.Name, h.Permits, h.Tenant, h.Cost = name, 1, "{http.request.header.X-Tenant}", cost
	charged := make(chan float64, 10)
	h.charged = func(used float64) { charged <- used }
	return provisionLocal(t, newContext(t), h), charged
}

func TestCostTimeChargesTheHoldAndLearnsIt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h, charged := costHandler(t, "cost-time", CostTime, &Handler{})
	next := newHolder()

	req := newRequest(context.Background(), `{}`, "X-Tenant", "a").start(h, next)
	next.waitEntered(t)
	time.Sleep(300 * time.Millisecond)
	close(next.release)
	req.wait(t)
	require.NoError(t, req.err)
	var used float64
	select {
	case used = <-charged:
	case <-time.After(5 * time.Second):
		t.Fatal("no Charge")
	}
	assert.GreaterOrEqual(t, used, 0.3, "the seconds held")
	assert.Less(t, used, 1.0)
	// The next request is estimated from the hold: 1 + 0.2*(used-1).
	assert.InDelta(t, 1+holdAlpha*(used-1), h.hold.estimate(), 1e-9)
	settled(t, h)
}

func TestCostTokensChargesTheUsageOfTheResponse(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h, charged := costHandler(t, "cost-tokens", CostTokens, &Handler{MaxCost: 100000})
	mock := mockllm.New(mockllm.Config{Delay: -1})
	srv := serve(t, h, proxyTo(t, mock.Handler()))
	ask := func(body string, tokens int) *http.Response {
		req, err := http.NewRequest(http.MethodPost, srv.url+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", "a")
		req.Header.Set(mockllm.HeaderTokens, strconv.Itoa(tokens))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	next := func() (float64, bool) {
		select {
		case used := <-charged:
			return used, true
		case <-time.After(300 * time.Millisecond):
			return 0, false
		}
	}
	// The mock's usage: prompt_tokens = ceil(body bytes / 4) plus the
	// tokens it sends; the estimate was the prompt's text / 4 + 5000.
	whole := `{"model":"m","max_tokens":5000,"messages":[{"role":"user","content":"hello"}]}`
	resp := ask(whole, 7)
	_, _ = io.ReadAll(resp.Body)
	<-srv.outcomes
	used, ok := next()
	require.True(t, ok, "JSON answer: Charge")
	assert.Equal(t, float64((len(whole)+3)/4+7), used)

	stream := `{"model":"m","max_tokens":5000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
	resp = ask(stream, 9)
	body, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(body), `"total_tokens"`)
	assert.True(t, strings.HasSuffix(string(body), "data: [DONE]\n\n"), "the stream reaches the client whole")
	<-srv.outcomes
	used, ok = next()
	require.True(t, ok, "SSE answer with a usage chunk: Charge")
	assert.Equal(t, float64((len(stream)+3)/4+9), used)

	bare := `{"model":"m","max_tokens":5000,"stream":true}`
	resp = ask(bare, 3)
	_, _ = io.ReadAll(resp.Body)
	<-srv.outcomes
	_, ok = next()
	assert.False(t, ok, "no usage: no Charge, the estimate stands")
	settled(t, h)
}

func TestCostTokensDoesNotDelayTheStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h, charged := costHandler(t, "cost-stream", CostTokens, &Handler{})
	mock := mockllm.New(mockllm.Config{Tokens: 3, Delay: 400 * time.Millisecond})
	srv := serve(t, h, proxyTo(t, mock.Handler()))
	body := `{"stream":true,"stream_options":{"include_usage":true}}`
	req, err := http.NewRequest(http.MethodPost, srv.url+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "data: {"), line)
	assert.Less(t, time.Since(start), 800*time.Millisecond, "the first token arrives before the second is sent")
	rest, _ := io.ReadAll(r)
	assert.True(t, bytes.HasSuffix(rest, []byte("data: [DONE]\n\n")))
	<-srv.outcomes
	select {
	case used := <-charged:
		assert.Equal(t, float64((len(body)+3)/4+3), used)
	case <-time.After(5 * time.Second):
		t.Fatal("no Charge")
	}
	settled(t, h)
}

// With sse_keepalive the stream's header is sent while the request
// waits; the upstream's events, usage chunk included, are read all the
// same once relayed.
func TestCostTokensReadsACommittedStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h, charged := costHandler(t, "cost-committed", CostTokens, &Handler{
		SSEKeepalive: caddy.Duration(100 * time.Millisecond), MaxWait: caddy.Duration(5 * time.Second)})
	mock := mockllm.New(mockllm.Config{Tokens: 4, Delay: -1})
	srv := serve(t, h, proxyTo(t, mock.Handler()))
	release := holdPermit(t, h) // its warm-up answer has no usage: no Charge

	body := `{"stream":true,"stream_options":{"include_usage":true}}`
	resp := srv.post(t, context.Background(), body)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, ": queued"), "a keepalive while it waits: %q", line)
	release()
	rest, _ := io.ReadAll(r)
	assert.Contains(t, string(rest), `"total_tokens"`)
	<-srv.outcomes
	select {
	case used := <-charged:
		assert.Equal(t, float64((len(body)+3)/4+4), used)
	case <-time.After(5 * time.Second):
		t.Fatal("no Charge")
	}
	assert.Empty(t, charged, "one Charge, for the streamed request")
	settled(t, h)
}
