// Package loadgen drives OpenAI-style chat completion requests at one or
// more HTTP targets and measures what each request saw: status, the
// Fair-Queue-Reason of a reject, time to first byte, total time, and for
// streams whether they ended with [DONE] or with an `event: error`.
//
// It runs a closed loop (a fixed number of clients, each sending its next
// request when the previous one ends), an open loop (a fixed arrival
// rate, whatever the responses) or a scheduled open loop (Config.Schedule:
// each request at its own time with its own size; NewPlan draws
// LLM-shaped ones, shape.go). cmd/loadgen is its command line and
// the bench (bench/) reuses it to compare systems.
package loadgen

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Request headers understood by internal/mockllm, and the header a
// fair_queue reject carries.
const (
	HeaderMockTokens = "X-Mock-Tokens"
	HeaderMockDelay  = "X-Mock-Delay"
	HeaderReason     = "Fair-Queue-Reason"
)

// DefaultPath is the request path appended to each target.
const DefaultPath = "/v1/chat/completions"

// Config describes one load run.
type Config struct {
	// Targets are base URLs ("http://127.0.0.1:8080"); requests go to
	// them in round-robin order. At least one.
	Targets []string `json:"targets"`
	// Path is appended to every target. Default DefaultPath.
	Path string `json:"path,omitempty"`

	// Clients is the number of concurrent clients of a closed loop. Zero
	// with Rate > 0 selects the open loop.
	Clients int `json:"clients,omitempty"`
	// Requests stops a closed loop after that many requests in total
	// (zero: no limit, Duration must be set).
	Requests int `json:"requests,omitempty"`
	// Duration stops sending new requests after that time (zero: no
	// limit, Requests must be set). Requests already sent run to their
	// end.
	Duration time.Duration `json:"duration_ns,omitempty"`
	// Rate is the arrival rate of the open loop, in requests per second;
	// arrivals are evenly spaced. Requires Duration.
	Rate float64 `json:"rate,omitempty"`
	// Schedule, when not empty, selects a scheduled open loop: one
	// request per Arrival, sent at its time whatever the responses, with
	// its own tokens, delay and prompt size. Rate and Clients must then
	// be zero; Duration, when set, leaves out the arrivals at or after
	// it. Not part of the JSON form (a report would repeat it).
	Schedule []Arrival `json:"-"`
	// MaxInFlight bounds the requests of the open loop running at once;
	// an arrival beyond it is not sent and counted as dropped. Default
	// 20000.
	MaxInFlight int `json:"max_in_flight,omitempty"`

	// Stream asks for a streamed answer ("stream": true).
	Stream bool `json:"stream,omitempty"`
	// Tokens, when >= 0, is sent as X-Mock-Tokens. Negative: not sent.
	Tokens int `json:"tokens"`
	// Delay, when >= 0, is sent as X-Mock-Delay. Negative: not sent.
	Delay time.Duration `json:"delay_ns"`
	// PromptBytes is the size of the user message content. Default 16.
	PromptBytes int `json:"prompt_bytes,omitempty"`
	// Model is the "model" of each request. Default "mock".
	Model string `json:"model,omitempty"`
	// Header holds extra request headers.
	Header http.Header `json:"header,omitempty"`
	// Timeout bounds each request, first byte to last. Default 60s.
	Timeout time.Duration `json:"timeout_ns,omitempty"`

	// KeepResults keeps every Result in the Report.
	KeepResults bool `json:"keep_results,omitempty"`
}

// Defaults of Config.
const (
	DefaultMaxInFlight = 20000
	DefaultPromptBytes = 16
	DefaultModel       = "mock"
	DefaultTimeout     = 60 * time.Second
)

// withDefaults returns c with its zero fields set to their defaults, or an
// error if c cannot be run.
func (c Config) withDefaults() (Config, error) {
	if len(c.Targets) == 0 {
		return c, errors.New("no target")
	}
	targets := make([]string, 0, len(c.Targets))
	for _, t := range c.Targets {
		t = strings.TrimRight(strings.TrimSpace(t), "/")
		if t == "" {
			continue
		}
		if !strings.Contains(t, "://") {
			t = "http://" + t
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		return c, errors.New("no target")
	}
	c.Targets = targets
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.PromptBytes <= 0 {
		c.PromptBytes = DefaultPromptBytes
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	switch {
	case c.Rate < 0 || c.Clients < 0 || c.Requests < 0 || c.Duration < 0:
		return c, errors.New("rate, clients, requests and duration must not be negative")
	case len(c.Schedule) > 0 && (c.Rate > 0 || c.Clients > 0):
		return c, errors.New("a schedule is an open loop of its own: no rate, no clients")
	case len(c.Schedule) > 0:
		for i, a := range c.Schedule {
			if a.At < 0 || (i > 0 && a.At < c.Schedule[i-1].At) {
				return c, errors.New("schedule: arrival times must be >= 0 and in order")
			}
		}
		return c, nil
	case c.Rate > 0 && c.Clients > 0:
		return c, errors.New("choose a closed loop (clients) or an open loop (rate), not both")
	case c.Rate > 0 && c.Duration == 0:
		return c, errors.New("an open loop needs a duration")
	case c.Rate == 0 && c.Clients == 0:
		return c, errors.New("need clients (closed loop) or a rate (open loop)")
	case c.Rate == 0 && c.Requests == 0 && c.Duration == 0:
		return c, errors.New("a closed loop needs a request count or a duration")
	}
	return c, nil
}

// Open reports whether c is an open-loop run (a rate or a schedule).
func (c Config) Open() bool { return c.Rate > 0 || len(c.Schedule) > 0 }

// Arrival is one request of a scheduled open loop (Config.Schedule).
type Arrival struct {
	// At is when it is sent, since the start of the run.
	At time.Duration `json:"at_ns"`
	// Tokens and Delay are sent as X-Mock-Tokens and X-Mock-Delay,
	// instead of Config's, when >= 0; negative: Config's apply.
	Tokens int           `json:"tokens"`
	Delay  time.Duration `json:"delay_ns"`
	// PromptBytes, when > 0, is the size of its user message instead of
	// Config.PromptBytes.
	PromptBytes int `json:"prompt_bytes,omitempty"`
}

// String describes the load in one line.
func (c Config) String() string {
	var b strings.Builder
	if len(c.Schedule) > 0 {
		fmt.Fprintf(&b, "scheduled open loop of %d arrivals", len(c.Schedule))
		if c.Duration > 0 {
			fmt.Fprintf(&b, " for %s", c.Duration)
		}
	} else if c.Open() {
		fmt.Fprintf(&b, "open loop %.0f req/s for %s", c.Rate, c.Duration)
	} else {
		fmt.Fprintf(&b, "closed loop %d clients", c.Clients)
		if c.Requests > 0 {
			fmt.Fprintf(&b, ", %d requests", c.Requests)
		}
		if c.Duration > 0 {
			fmt.Fprintf(&b, ", for %s", c.Duration)
		}
	}
	if c.Stream {
		b.WriteString(", streaming")
	}
	fmt.Fprintf(&b, ", %d target(s)", len(c.Targets))
	return b.String()
}
