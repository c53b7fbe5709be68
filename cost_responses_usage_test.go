package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// responsesCompleted is a Responses API response.completed event as
// OpenAI serializes it: the whole response, its output text (text, of
// any length) before its usage, then user, metadata and the event's
// sequence_number.
func responsesCompleted(text, usage string) string {
	return `event: response.completed` + "\n" +
		`data: {"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed",` +
		`"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"` + text + `","annotations":[]}]}],` +
		`"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"usage":{"type":"object","properties":{}}}}}],` +
		`"truncation":"disabled","usage":` + usage + `,"user":null,"metadata":{}},"sequence_number":9}` + "\n\n"
}

// realUsage is the usage of responsesCompleted's answer in these tests.
const realUsage = `{"input_tokens":40,"input_tokens_details":{"cached_tokens":0},"output_tokens":60,` +
	`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":100}`

// flowUsage waits until the queue name has one flow waiting and returns
// its usage counter (what its tenant was charged, above the others).
func flowUsage(t *testing.T, name string) float64 {
	t.Helper()
	var usage float64
	require.Eventually(t, func() bool {
		for _, q := range queueStatus(t.Context()).Queues {
			if q.Name == name && q.Snapshot != nil && len(q.Snapshot.Flows) == 1 && q.Snapshot.Flows[0].Waiting == 1 {
				usage = q.Snapshot.Flows[0].Usage
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "one flow waits")
	return usage
}

// An agent's Responses API stream ends with a response.completed event
// that repeats the whole response: with a long answer its one data line
// is far beyond 64 KiB. Its response.usage, near the line's end, is
// what cost tokens charges the tenant (not the estimate, 20000 tokens
// of budget) and what the prompt estimate learns from.
func TestCostTokensReadsTheUsageOfALongResponsesAPICompletedEvent(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "cost-responses-long"
	long := strings.Repeat("All work and no play makes Jack a dull boy. ", 200<<10/44)
	held, release := make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Tenant") == "b" {
			held <- struct{}{}
			<-release
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"response","output":[]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"All\"}\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, responsesCompleted(long, realUsage))
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"tenant":"{http.request.header.X-Tenant}","cost":"tokens",
			"kv_tokens":1000000,"max_wait":"30s"}`, name),
		fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.URL, "http://")))
	ask := func(tenant string) (string, error) {
		// 160 bytes of prompt text: 4 bytes per token for the 40 input tokens.
		body := `{"model":"m","stream":true,"max_output_tokens":20000,"input":"` + strings.Repeat("abcd", 40) + `"}`
		req, err := http.NewRequest(http.MethodPost, url+"/v1/responses", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		return string(got), err
	}

	got, err := ask("a")
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(got, responsesCompleted(long, realUsage)), "the long event reaches the client whole")
	var samples int64
	require.Eventually(t, func() bool {
		for _, q := range queueStatus(t.Context()).Queues {
			if q.Name == name && q.Stats != nil && q.Stats.InFlight == 0 && q.KV != nil {
				samples = q.KV.Samples // learned before the release
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "a's request ends")
	assert.EqualValues(t, 1, samples, "the prompt estimate learns the answer's input_tokens")

	// b holds the one permit; a's next request waits, its flow at what
	// a was charged.
	bDone := make(chan error, 1)
	go func() { _, err := ask("b"); bDone <- err }()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("b never reached the upstream")
	}
	aDone := make(chan error, 1)
	go func() { _, err := ask("a"); aDone <- err }()
	usage := flowUsage(t, name)
	close(release)
	require.NoError(t, <-bDone)
	require.NoError(t, <-aDone)
	assert.InDelta(t, 100, usage, 1e-9, "a is charged its answer's response.usage.total_tokens, not its estimate")
}
