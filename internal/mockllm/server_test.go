package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func start(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return s, hs
}

// post sends a completion request; headers alternate name, value.
func post(t *testing.T, ctx context.Context, url, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// events reads server-sent events until EOF and returns their data.
func events(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "unexpected line %q", line)
		out = append(out, data)
	}
	require.NoError(t, sc.Err())
	return out
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func TestChatStreamSendsOneChunkPerTokenThenDone(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{Delay: time.Millisecond})
	resp := post(t, context.Background(), hs.URL+"/v1/chat/completions",
		`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		HeaderTokens, "3")
	defer resp.Body.Close()

	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	ev := events(t, resp.Body)
	require.Len(t, ev, 4)
	assert.Equal(t, "[DONE]", ev[3])
	for i, data := range ev[:3] {
		var c chunk
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		assert.Equal(t, "chat.completion.chunk", c.Object)
		assert.Equal(t, "m1", c.Model)
		assert.True(t, strings.HasPrefix(c.ID, "chatcmpl-"), c.ID)
		require.Len(t, c.Choices, 1)
		assert.Equal(t, "tok ", c.Choices[0].Delta.Content)
		if i < 2 {
			assert.Nil(t, c.Choices[0].FinishReason)
		} else {
			require.NotNil(t, c.Choices[0].FinishReason)
			assert.Equal(t, "stop", *c.Choices[0].FinishReason)
		}
	}
	assert.Equal(t, 1, s.Served())
	assert.Zero(t, s.InFlight())
}

func TestTextStreamUsesTextCompletionChunks(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{Tokens: 2, Delay: time.Millisecond})
	resp := post(t, context.Background(), hs.URL+"/v1/completions", `{"prompt":"hi","stream":true}`)
	defer resp.Body.Close()

	ev := events(t, resp.Body)
	require.Len(t, ev, 3)
	var c chunk
	require.NoError(t, json.Unmarshal([]byte(ev[0]), &c))
	assert.Equal(t, "text_completion", c.Object)
	assert.Equal(t, "mock", c.Model)
	assert.Equal(t, "tok ", c.Choices[0].Text)
}

func TestStreamFlushesEachTokenBeforeTheNext(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, hs.URL+"/v1/chat/completions", `{"stream":true}`,
		HeaderTokens, "100", HeaderDelay, "10ms")
	defer resp.Body.Close()

	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "data: {"), line)
	// The first token arrived while the other 99 (a second) are to come.
	assert.Equal(t, 1, s.InFlight())
}

func TestNonStreamReturnsWholeCompletionAfterAllTokens(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{})
	began := time.Now()
	resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{"model":"m2"}`,
		HeaderTokens, "3", HeaderDelay, "30ms")
	defer resp.Body.Close()

	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(began), 90*time.Millisecond)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var got struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	assert.Equal(t, "chat.completion", got.Object)
	assert.Equal(t, "m2", got.Model)
	require.Len(t, got.Choices, 1)
	assert.Equal(t, "assistant", got.Choices[0].Message.Role)
	assert.Equal(t, "tok tok tok ", got.Choices[0].Message.Content)
	assert.Equal(t, "stop", got.Choices[0].FinishReason)
	assert.Equal(t, 3, got.Usage.CompletionTokens)
	assert.Equal(t, 1, s.Served())
}

func TestClientGoneStopsTheStream(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, hs.URL+"/v1/chat/completions", `{"stream":true}`,
		HeaderTokens, "1000", HeaderDelay, "10ms")
	defer resp.Body.Close()
	_, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)

	cancel()
	require.Eventually(t, func() bool { return s.InFlight() == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, s.Canceled())
	assert.Zero(t, s.Served())
}

func TestMaxInFlightCountsConcurrentCompletions(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{})
	const n = 6
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions",
				strings.NewReader(`{"stream":true}`))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set(HeaderTokens, "1000")
			req.Header.Set(HeaderDelay, "10ms")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if ctx.Err() == nil { // the test's own cancel ends them all
					t.Error(err)
				}
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
		})
	}
	require.Eventually(t, func() bool { return s.InFlight() == n }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, n, s.MaxInFlight())

	cancel()
	wg.Wait()
	require.Eventually(t, func() bool { return s.InFlight() == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, n, s.MaxInFlight(), "max survives the requests")
	assert.Equal(t, n, s.Canceled())

	s.Reset()
	for range 3 {
		resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{}`, HeaderTokens, "1")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	assert.Equal(t, 1, s.MaxInFlight(), "sequential requests never overlap")
	assert.Equal(t, 3, s.Served())
	assert.Zero(t, s.Canceled())
}

func TestStatsRecordArrivalsInOrderAndReset(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{Tokens: 1, Delay: time.Millisecond})
	for _, seq := range []string{"c1-0", "", "c2-0", "c1-1"} {
		var h []string
		if seq != "" {
			h = []string{HeaderClientSeq, seq}
		}
		resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{"stream":true}`, h...)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	stats := func(method, path string) Stats {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var st Stats
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		return st
	}
	assert.Equal(t, Stats{MaxInFlight: 1, Served: 4, Arrivals: []string{"c1-0", "c2-0", "c1-1"}},
		stats(http.MethodGet, "/stats"))
	assert.Equal(t, Stats{Arrivals: []string{}}, stats(http.MethodPost, "/stats/reset"))
	assert.Equal(t, Stats{Arrivals: []string{}}, stats(http.MethodGet, "/stats"))
}

// ServiceTimes holds, per X-Client-Seq, the time each request stayed:
// at least its tokens x delay; Reset forgets them.
func TestServiceTimesRecordEachRequestsStay(t *testing.T) {
	t.Parallel()
	s, hs := start(t, Config{Tokens: 1, Delay: 5 * time.Millisecond})
	for _, c := range []struct{ seq, tokens string }{{"one", "1"}, {"four", "4"}, {"", "1"}} {
		h := []string{HeaderTokens, c.tokens}
		if c.seq != "" {
			h = append(h, HeaderClientSeq, c.seq)
		}
		resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{"stream":true}`, h...)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	took := s.ServiceTimes()
	require.Len(t, took, 2, "one entry per request with a sequence: %v", took)
	assert.GreaterOrEqual(t, took["one"], 5*time.Millisecond)
	assert.GreaterOrEqual(t, took["four"], 20*time.Millisecond)
	s.Reset()
	assert.Empty(t, s.ServiceTimes())
}

func TestInvalidRequestsAreRejectedWith400(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string
		headers []string
	}{
		{"bad json", `{"stream":`, nil},
		{"negative tokens", `{}`, []string{HeaderTokens, "-1"}},
		{"non-numeric tokens", `{}`, []string{HeaderTokens, "many"}},
		{"bad delay", `{}`, []string{HeaderDelay, "soon"}},
		{"negative delay", `{}`, []string{HeaderDelay, "-1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, hs := start(t, Config{})
			resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", tt.body, tt.headers...)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			assert.NotEmpty(t, e.Error.Message)
			assert.Zero(t, s.Served())
			assert.Zero(t, s.InFlight())
		})
	}
}

func TestModelsHealthAndMethods(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{})

	resp, err := http.Get(hs.URL + "/v1/models")
	require.NoError(t, err)
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	resp.Body.Close()
	assert.Equal(t, "list", models.Object)
	require.NotEmpty(t, models.Data)
	assert.Equal(t, "mock", models.Data[0].ID)

	resp, err = http.Get(hs.URL + "/health")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "ok\n", string(body))

	resp, err = http.Get(hs.URL + "/v1/chat/completions")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestNewAppliesDefaults(t *testing.T) {
	tests := []struct {
		cfg        Config
		wantTokens int
		wantDelay  time.Duration
	}{
		{Config{}, DefaultTokens, DefaultDelay},
		{Config{Tokens: 3, Delay: time.Second}, 3, time.Second},
		{Config{Tokens: -1, Delay: -1}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.cfg.Tokens), func(t *testing.T) {
			s := New(tt.cfg)
			assert.Equal(t, tt.wantTokens, s.tokens)
			assert.Equal(t, tt.wantDelay, s.delay)
		})
	}
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func TestAnswersCarryUsage(t *testing.T) {
	t.Parallel()
	_, hs := start(t, Config{Delay: -1})
	body := `{"model":"m","messages":[{"role":"user","content":"hello there"}]}` // 67 bytes: 17 prompt tokens
	want := usage{PromptTokens: 17, CompletionTokens: 5, TotalTokens: 22}

	resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", body, HeaderTokens, "5")
	defer resp.Body.Close()
	var whole struct {
		Usage usage `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&whole))
	assert.Equal(t, want, whole.Usage)

	// Streamed with include_usage: every chunk has "usage":null, then one
	// without choices carries it, then [DONE].
	streamed := strings.TrimSuffix(body, "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
	want.PromptTokens = (len(streamed) + 3) / 4
	want.TotalTokens = want.PromptTokens + 5
	resp = post(t, context.Background(), hs.URL+"/v1/chat/completions", streamed, HeaderTokens, "5")
	defer resp.Body.Close()
	data := events(t, resp.Body)
	require.Len(t, data, 7, "5 tokens, the usage chunk, [DONE]")
	for _, d := range data[:5] {
		var c map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(d), &c))
		assert.Equal(t, "null", string(c["usage"]), d)
	}
	var last struct {
		Choices []any  `json:"choices"`
		Usage   *usage `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(data[5]), &last))
	assert.Empty(t, last.Choices)
	require.NotNil(t, last.Usage)
	assert.Equal(t, want, *last.Usage)
	assert.Equal(t, "[DONE]", data[6])

	// Without include_usage, as OpenAI: no usage at all.
	resp = post(t, context.Background(), hs.URL+"/v1/completions", `{"stream":true}`, HeaderTokens, "2")
	defer resp.Body.Close()
	data = events(t, resp.Body)
	require.Len(t, data, 3)
	for _, d := range data {
		assert.NotContains(t, d, "usage")
	}
}

// Requests that ask to queue wait for one of the slots, in arrival order;
// the others are answered at once, however many run.
func TestSlotsHoldQueueingRequestsInArrivalOrder(t *testing.T) {
	s, hs := start(t, Config{Tokens: 1, Delay: 50 * time.Millisecond, Slots: 2})
	const n = 6
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{}`,
				HeaderQueue, "1", HeaderClientSeq, strconv.Itoa(i))
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
		// Arrive in order: the next request once this one is answered
		// or waits for a slot.
		require.Eventually(t, func() bool {
			st := s.Stats()
			return len(st.Arrivals)+st.Waiting == i+1
		}, 5*time.Second, time.Millisecond)
	}
	wg.Wait()
	assert.Equal(t, 2, s.MaxInFlight(), "never more than the slots")
	assert.Equal(t, n, s.Served())
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, s.Arrivals(), "answered in arrival order")

	s.Reset()
	for range n {
		wg.Go(func() {
			resp := post(t, context.Background(), hs.URL+"/v1/chat/completions", `{}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	assert.Equal(t, n, s.Served())
	assert.Greater(t, s.MaxInFlight(), 2, "without the header, requests do not wait for a slot")
}

// A request that leaves while it waits for a slot gives up its place: it
// never arrives, and the slot goes to the next.
func TestRequestLeavingWhileWaitingForASlotNeverArrives(t *testing.T) {
	s, hs := start(t, Config{Tokens: 1, Delay: 200 * time.Millisecond, Slots: 1})
	var wg sync.WaitGroup
	send := func(ctx context.Context, seq string) {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(`{}`))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set(HeaderQueue, "1")
			req.Header.Set(HeaderClientSeq, seq)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return // the one that leaves
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	send(context.Background(), "a")
	require.Eventually(t, func() bool { return s.InFlight() == 1 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	send(ctx, "b")
	require.Eventually(t, func() bool { return s.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	send(context.Background(), "c")
	require.Eventually(t, func() bool { return s.Stats().Waiting == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	require.Eventually(t, func() bool { return s.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	wg.Wait()
	assert.Equal(t, []string{"a", "c"}, s.Arrivals())
	assert.Equal(t, 1, s.MaxInFlight())
	assert.Zero(t, s.Stats().Waiting)
}
