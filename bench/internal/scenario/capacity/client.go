package capacity

// The capacity scenario's client: each request of the drawn sequence
// sent at its time, its stream read.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// capResult is what one request of the sequence saw, times since the
// run's start.
type capResult struct {
	Start, FirstToken, End time.Duration
	Tokens                 int
	Status                 int
	Done, Rejected, Cut    bool
	Err                    string
}

// capTransport carries the scenario's requests: one connection each.
var capTransport = &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, DisableCompression: true}

// capClient sends a run's requests.
type capClient struct {
	hc    *http.Client
	start time.Time // the run's: results' times are since it
	// noMaxTokens: the bodies set no budget (capBody), and each answer's
	// length goes in mockllm's X-Mock-Tokens header.
	noMaxTokens bool
}

// sendCapacity sends each request of seq at its time (to the targets in
// turn) and reads its stream until ctx ends. noMaxTokens: see capClient.
func sendCapacity(ctx context.Context, targets []string, seq []capRequest, start time.Time, noMaxTokens bool) []capResult {
	c := &capClient{hc: &http.Client{Transport: capTransport}, start: start, noMaxTokens: noMaxTokens}
	defer capTransport.CloseIdleConnections() // the next run's system listens elsewhere
	text := strings.Repeat("xxxx", maxPrompt(seq))
	results := make([]capResult, len(seq))
	var wg sync.WaitGroup
	for i, q := range seq {
		wg.Go(func() {
			if scenario.SleepCtx(ctx, time.Until(start.Add(q.At))) != nil {
				results[i] = capResult{Start: q.At, End: q.At, Cut: true}
				return
			}
			results[i] = c.send(ctx, targets[i%len(targets)], q, text[:4*q.Prompt])
		})
	}
	wg.Wait()
	return results
}

func maxPrompt(seq []capRequest) int {
	n := 0
	for _, q := range seq {
		n = max(n, q.Prompt)
	}
	return n
}

// capBody is the body of q's streamed chat request: its max_tokens the
// answer's length, or with noMaxTokens no budget and a request for the
// usage, as a chat client that lets the model stop sends it.
func capBody(q capRequest, text string, noMaxTokens bool) []byte {
	m := map[string]any{
		"model": "mock", "stream": true, "max_tokens": q.Answer,
		"messages": []any{map[string]string{"role": "user", "content": text}},
	}
	if noMaxTokens {
		delete(m, "max_tokens")
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	body, err := json.Marshal(m)
	if err != nil {
		panic(err) // cannot happen: the types are fixed
	}
	return body
}

// send sends one streamed chat request and reads its answer.
func (c *capClient) send(ctx context.Context, target string, q capRequest, text string) (r capResult) {
	r.Start = time.Since(c.start)
	defer func() { r.End = time.Since(c.start) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/v1/chat/completions",
		bytes.NewReader(capBody(q, text, c.noMaxTokens)))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	if c.noMaxTokens {
		req.Header.Set(mockllm.HeaderTokens, itoa(q.Answer))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		r.Cut, r.Err = ctx.Err() != nil, err.Error()
		return r
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		r.Rejected = true
		return r
	}
	if resp.StatusCode != http.StatusOK {
		r.Err = "status " + resp.Status
		return r
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case bytes.HasPrefix(line, []byte("event: error")):
			r.Rejected = true
		case bytes.Equal(bytes.TrimSpace(line), []byte("data: [DONE]")):
			r.Done = true
			// Read to the end: a connection closed before it cuts the
			// proxy's copy of the answer's last bytes (its log says so).
			_, _ = io.Copy(io.Discard, br)
			return r
		case bytes.HasPrefix(line, []byte("data: ")) && bytes.Contains(line, []byte(`"content"`)):
			if r.Tokens == 0 {
				r.FirstToken = time.Since(c.start)
			}
			r.Tokens++
		}
		if err != nil {
			r.Cut = ctx.Err() != nil
			if !r.Cut && !r.Rejected {
				r.Err = err.Error()
			}
			return r
		}
	}
}
