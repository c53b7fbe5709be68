package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"time"
)

// Outcomes of a request.
const (
	// OutcomeOK: status 200 and, for a stream, [DONE] without an error
	// event.
	OutcomeOK = "ok"
	// OutcomeRejected: a Fair-Queue-Reason header, an SSE error event, or
	// status 429 or 503.
	OutcomeRejected = "rejected"
	// OutcomeFailed: a transport error, a timeout, another status, or a
	// stream that ended without [DONE].
	OutcomeFailed = "failed"
	// OutcomeCanceled: the run was canceled while the request ran.
	OutcomeCanceled = "canceled"
)

// Result is what one request saw.
type Result struct {
	// Target is the base URL the request went to.
	Target string `json:"target"`
	// Start is when the request was sent, since the start of the run.
	Start time.Duration `json:"start_ns"`
	// Status is the HTTP status, 0 if no response came.
	Status int `json:"status"`
	// Reason is the Fair-Queue-Reason header of a reject.
	Reason string `json:"reason,omitempty"`
	// TTFB is the time to the first byte of the response. Behind a queue
	// and with a streaming upstream that sends its headers at once, this
	// is the time spent waiting for a permit.
	TTFB time.Duration `json:"ttfb_ns"`
	// Total is the time to the end of the response.
	Total time.Duration `json:"total_ns"`
	// Done reports that a stream ended with "data: [DONE]".
	Done bool `json:"done,omitempty"`
	// SSEError reports that a stream carried an `event: error`.
	SSEError bool `json:"sse_error,omitempty"`
	// Outcome is one of the Outcome constants.
	Outcome string `json:"outcome"`
	// Err describes a transport error or a timeout.
	Err string `json:"error,omitempty"`
	// Arrival is the index of the request in Config.Schedule; -1 when
	// the run has no schedule.
	Arrival int `json:"arrival"`
}

// do sends one request to target and reads the whole response; arrival,
// when >= 0, is its index in the schedule, whose tokens, delay and prompt
// size replace the Config's.
func (r *Runner) do(ctx context.Context, target string, arrival int) Result {
	res := Result{Target: target, Arrival: arrival}
	body, tokens, delay := r.body, r.cfg.Tokens, r.cfg.Delay
	if arrival >= 0 {
		a := r.cfg.Schedule[arrival]
		if a.PromptBytes > 0 {
			body = requestBody(r.cfg.Model, r.cfg.Stream, a.PromptBytes)
		}
		if a.Tokens >= 0 {
			tokens = a.Tokens
		}
		if a.Delay >= 0 {
			delay = a.Delay
		}
	}
	start := time.Now()
	r.mu.Lock()
	res.Start = start.Sub(r.start)
	r.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var firstByte time.Time
	rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{
		GotFirstResponseByte: func() { firstByte = time.Now() },
	})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, target+r.cfg.Path, bytes.NewReader(body))
	if err != nil {
		res.Outcome, res.Err = OutcomeFailed, err.Error()
		return res
	}
	for k, vs := range r.cfg.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set("Content-Type", "application/json")
	if r.cfg.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if tokens >= 0 {
		req.Header.Set(HeaderMockTokens, strconv.Itoa(tokens))
	}
	if delay >= 0 {
		req.Header.Set(HeaderMockDelay, delay.String())
	}

	resp, err := r.client.Do(req)
	if err != nil {
		res.Total = time.Since(start)
		res.Outcome, res.Err = failure(ctx, rctx, err)
		return res
	}
	defer resp.Body.Close()
	if firstByte.IsZero() {
		firstByte = time.Now()
	}
	res.TTFB = firstByte.Sub(start)
	res.Status = resp.StatusCode
	res.Reason = resp.Header.Get(HeaderReason)
	if res.Status == http.StatusOK && res.Reason == "" {
		r.live.Granted.Add(1)
	}

	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		res.Done, res.SSEError, err = readEvents(resp.Body)
	} else {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	res.Total = time.Since(start)
	switch {
	case err != nil:
		res.Outcome, res.Err = failure(ctx, rctx, err)
	case res.Reason != "" || res.SSEError ||
		res.Status == http.StatusTooManyRequests || res.Status == http.StatusServiceUnavailable:
		res.Outcome = OutcomeRejected
	case res.Status != http.StatusOK:
		res.Outcome = OutcomeFailed
	case r.cfg.Stream && !res.Done:
		res.Outcome, res.Err = OutcomeFailed, "stream ended without [DONE]"
	default:
		res.Outcome = OutcomeOK
	}
	return res
}

// failure classifies a request error: canceled if the run was canceled,
// else failed, naming a timeout as such.
func failure(runCtx, reqCtx context.Context, err error) (outcome, msg string) {
	if runCtx.Err() != nil {
		return OutcomeCanceled, "canceled"
	}
	if errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
		return OutcomeFailed, "timeout"
	}
	return OutcomeFailed, err.Error()
}

// readEvents reads a server-sent event stream to its end and reports
// whether it carried "data: [DONE]" and whether it carried an error event.
func readEvents(body io.Reader) (done, sseError bool, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "event: error" || line == "event:error":
			sseError = true
		case line == "data: [DONE]" || line == "data:[DONE]":
			done = true
		}
	}
	return done, sseError, sc.Err()
}
