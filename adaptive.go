package caddyfairqueue

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// AdaptiveConfig makes the queue learn its capacity from the backend's
// time to first token (`adaptive` block; JSON `adaptive`): the capacity
// in force (permits, kv_tokens and each pool upstream's, alike) is a
// learned share of the configured one, between Floor and all of it, one
// value for every instance of the queue, kept in its store. AIMD: down
// by Decrease when more than BreachShare of the time-to-first-token
// samples of an interval were above TargetTTFT, or an upstream answered
// 429/503; up by Step when none was and requests had to wait (a window
// without a TTFT: once it holds MinSamples plain answers that succeeded);
// at most one move per Interval, cluster-wide. See docs/adaptive.md.
type AdaptiveConfig struct {
	// TargetTTFT is the time to first token to keep at or below: from
	// forwarding a granted request to its first response byte (a
	// stream's first chunk); plain answers (by their Content-Type, not
	// the client's Accept header: see call.streamed) and error answers
	// (status 300 and above) are not timed; a stream whose
	// first byte never came (its client or the proxy gave up) counts as
	// above the target once it was waited for longer than the target.
	// Required; at least 1ms.
	TargetTTFT caddy.Duration `json:"target_ttft"`
	// Floor is the least share of the configured capacity, in (0, 1];
	// default 0.0625 (1/16), and at least one permit.
	Floor float64 `json:"floor,omitempty"`
	// Interval is how often the capacity may move, and how often each
	// instance reports; default 1s, at least 100ms.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Decrease multiplies the share on a breach, in (0, 1); default 0.9.
	Decrease float64 `json:"decrease,omitempty"`
	// Step is added to the share after an interval under the target
	// while requests waited, in (0, 1]; default 0.015625 (1/64).
	Step float64 `json:"step,omitempty"`
	// BreachShare is the share of samples above the target that is a
	// breach, in (0, 1); default 0.01 (the target is a p99).
	BreachShare float64 `json:"breach_share,omitempty"`
	// MinSamples is how many samples a window needs before the target is
	// judged (a 429/503 moves the capacity at once); default
	// 1/breach_share within 10..100.
	MinSamples int `json:"min_samples,omitempty"`
	// BackendMetrics, when set, is where the backend's own gauges are read
	// every interval (Prometheus text, vLLM's or SGLang's names): a path
	// such as "/metrics" on each pool upstream (http://<dial><path>), or
	// the URL (http:// or https://) of the one backend of a queue without
	// a pool; anything else is refused at load. Each request the backend
	// preempted since the last read (vllm:num_preemptions_total, or
	// SGLang's sglang:num_retracted_requests_total), and each reading of
	// requests queued in it (vllm:num_requests_waiting or
	// sglang:num_queue_reqs > 0), counts as a time to first token above
	// the target, and each reading as one sample; a read that fails, or a
	// page that shows neither gauge of requests queued, is skipped.
	// Default: not read.
	BackendMetrics string `json:"backend_metrics,omitempty"`
}

// engine is the engine's form of a (nil: not adaptive).
func (a *AdaptiveConfig) engine() *fairqueue.Adaptive {
	if a == nil {
		return nil
	}
	return &fairqueue.Adaptive{TargetTTFT: time.Duration(a.TargetTTFT), Floor: a.Floor, Interval: time.Duration(a.Interval),
		Decrease: a.Decrease, Step: a.Step, BreachShare: a.BreachShare, MinSamples: a.MinSamples, BackendMetrics: a.BackendMetrics}
}

// parseAdaptive parses the adaptive block; see UnmarshalCaddyfile.
func parseAdaptive(d *caddyfile.Dispenser) (*AdaptiveConfig, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	a := new(AdaptiveConfig)
	err := parseBlock(d, map[string]optionParser{
		"target_ttft":     opt(&a.TargetTTFT, durationArg(minDuration)),
		"floor":           opt(&a.Floor, shareArg(true)),
		"interval":        opt(&a.Interval, durationArg(fairqueue.MinAdaptiveInterval)),
		"decrease":        opt(&a.Decrease, shareArg(false)),
		"step":            opt(&a.Step, shareArg(true)),
		"breach_share":    opt(&a.BreachShare, shareArg(false)),
		"min_samples":     opt(&a.MinSamples, intArg(1)),
		"backend_metrics": opt(&a.BackendMetrics, within(stringArg, checkBackendMetrics)),
	})
	if err != nil {
		return nil, err
	}
	if a.TargetTTFT == 0 {
		return nil, d.Err("adaptive: target_ttft is required")
	}
	return a, nil
}

// checkBackendMetrics is the rule of backend_metrics alone: a path (read
// on each pool upstream) or the backend's http:// or https:// URL. Which
// of the two the queue needs (a pool or not) is checked with the other
// options.
func checkBackendMetrics(v string) error {
	if strings.HasPrefix(v, "/") {
		return nil
	}
	if u, err := url.Parse(v); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return nil
	}
	return fmt.Errorf("adaptive: backend_metrics %q: want a path on each pool upstream (/metrics) or the backend's http:// or https:// URL", v)
}

// shareArg reads one number in (0, 1), or in (0, 1] when one is allowed:
// 0 is the unset value of these options (their default), never a share.
func shareArg(oneAllowed bool) func(*caddyfile.Dispenser) (float64, error) {
	return func(d *caddyfile.Dispenser) (float64, error) {
		opt, v, err := optionArg(d)
		if err != nil {
			return 0, err
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, d.Errf("adaptive: %s: '%s' is not a number", opt, v)
		}
		if f <= 0 || f > 1 || f == 1 && !oneAllowed {
			bounds := "(0, 1)"
			if oneAllowed {
				bounds = "(0, 1]"
			}
			return 0, d.Errf("adaptive: %s must be in %s, got %s", opt, bounds, v)
		}
		return f, nil
	}
}

// observeAnswer tells an adaptive queue what a forwarded request saw:
// its time to first byte, or that the upstream refused it. Only a
// streamed answer is timed (streamed): a plain answer's first byte
// comes after the whole generation, which says nothing of the backend's
// time to first token (a slow answer would pull the capacity to its
// floor). Nor is an error answer (a 400 or 404 for a request the backend
// does not take): it comes before the backend schedules anything, and a
// client streaming many would outnumber the late first tokens of
// everybody else's, keeping the capacity up while the backend is
// overloaded. A plain answer that succeeded is counted, not timed: it
// lets a queue whose clients never stream climb back after refusals. A
// stream whose first byte never came (its client, or reverse_proxy, gave
// up waiting) had a time to first token longer than it waited: above the
// target when that wait was; one the upstream answered with an error
// status (its body empty, or relayed as the error event of a committed
// stream) had none to wait for, nor had one reverse_proxy never got to
// the upstream (unreached): a backend that is down is not overloaded,
// and counted so, an outage would leave the capacity at its floor once
// the backend is back (a pool's cooldown keeps requests off it). Nor is
// the 503 reverse_proxy fails it with (no upstream available), noted as
// the status of a committed stream, a refusal of the backend's.
func (c *call) observeAnswer() {
	if c.fb == nil || c.h.Adaptive == nil {
		return
	}
	streamed := c.streamed()
	switch {
	case (c.fb.status == 429 || c.fb.status == 503) && !c.fb.unreached: // unreached: reverse_proxy's own 503 (relayEnd)
		c.e.q.ObserveRefused(c.fb.upstream)
	case c.fb.first > 0 && streamed && c.fb.status < 300: // 0: a 200 written by the first Write
		c.e.q.ObserveTTFT(c.fb.upstream, c.fb.first)
	case c.fb.first == 0 && streamed && !c.fb.heldBack && !c.fb.errorAnswered && !c.fb.hijacked && !c.fb.unreached:
		c.e.q.ObserveUnanswered(c.fb.upstream, time.Since(c.fb.forwarded))
	case !streamed && c.fb.status < 300 && (c.fb.status != 0 || c.fb.first > 0) && !c.fb.hijacked:
		c.e.q.ObserveAnswered(c.fb.upstream) // untimed, but no refusal: a plain queue climbs back
	}
}

// streamed reports whether the forwarded request's answer is a stream,
// for adaptive: what its Content-Type says (answerKindOf), or, where
// that does not tell (no header came, or one with no Content-Type or
// application/octet-stream), whether the request asked the backend for
// one (asksStream). Never the client's Accept header, which no backend
// reads: with it and "stream": false, any client would have its plain
// answers, whose first byte comes after the whole generation, timed as
// first tokens, and pull the capacity down to its floor.
func (c *call) streamed() bool {
	switch c.fb.kind {
	case answerStream:
		return true
	case answerPlain:
		return false
	case answerUnknown:
		if c.headerFirst {
			return false // a stream would have had its header at once
		}
	}
	return c.asksStream
}

// headerFirst reports whether r, of API a, is a native /generate (not
// TGI's /generate_stream), whose streams come with their header at once
// (SGLang's, vLLM's demo server's) and whose plain answers' header comes
// after the whole generation (TGI's, which never streams, whatever the
// body says): one whose header never came is no stream, and its client
// giving up on it counts nothing (streamed).
func headerFirst(r *http.Request, a api) bool {
	return generates(r, a) && !generatesStream(r)
}

// answerKind is what an answer is, for adaptive, by its Content-Type.
type answerKind uint8

const (
	answerUnknown   answerKind = iota // no header came (a 499, a client that left, is none)
	answerPlain                       // a JSON document, text, or another type that is no stream
	answerStream                      // an event stream, or JSON lines (Ollama's NDJSON)
	answerUnlabeled                   // no Content-Type or application/octet-stream: a stream not labeled as one
)

// answerKindOf is the kind of an answer whose header is h. Plain text is
// plain: every backend answers its Prometheus /metrics (Ollama its "/")
// at once as text/plain, and a client asking for a stream there would
// have its quick answers timed as first tokens, outnumbering the late
// ones of everybody else under overload.
func answerKindOf(h http.Header) answerKind {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	switch strings.ToLower(strings.TrimSpace(mt)) {
	case "text/event-stream", "application/x-ndjson", "application/ndjson", "application/jsonl",
		"application/x-jsonlines", "application/jsonlines", "application/json-seq", "application/stream+json":
		return answerStream
	case "", "application/octet-stream":
		return answerUnlabeled
	}
	return answerPlain
}

// asksStream reports whether a request of a with body fields f asks its
// backend for a streamed answer, as the backend reads it: Ollama's
// native chat and generate stream unless the body says "stream": false,
// its embed never; an OpenAI-compatible request streams when its body
// says "stream": true, except on an endpoint that never streams
// (neverStreams: embeddings, vLLM's /rerank or /score, an admin
// endpoint such as SGLang's /flush_cache), TGI's /generate_stream
// always. Unlike streams, not the Accept header: no backend reads it.
func (a api) asksStream(f jsonscan.Fields, r *http.Request) bool {
	switch a {
	case apiOllamaChat, apiOllamaGenerate:
		return !f.NoStream
	case apiOllamaEmbed:
		return false
	}
	return generatesStream(r) || f.Stream && !neverStreams(r, a)
}

// unreached reports whether err, next's, says that reverse_proxy never
// got the request to an upstream, however long it tried: every dial
// failed (refused, or timed out; its DialError), or no upstream was
// available (its health checks found them down: a 503 of its
// errNoUpstream, known by its message, which is not exported).
func unreached(err error) bool {
	if _, dial := errors.AsType[reverseproxy.DialError](err); dial {
		return true
	}
	he, ok := errors.AsType[caddyhttp.HandlerError](err)
	return ok && he.StatusCode == http.StatusServiceUnavailable && he.Err != nil && he.Err.Error() == "no upstreams available"
}

var (
	descCapacityShare = newStateDesc("capacity_share",
		"The learned share of the queue's configured capacity in force (adaptive, without a pool): permits and kv_tokens are this share of their configured values; as this instance last heard it from the store; absent when not adaptive or nothing was learned yet.")
	descUpstreamCapacityShare = newUpstreamDesc("upstream_capacity_share",
		"With adaptive and a pool: the learned share of each upstream's configured permits and kv_tokens in force, from its own answers; as this instance last heard it from the store; absent until that upstream's share was learned.")
)

// collectAdaptive reports the learned shares in force of adaptive queues,
// by queue label (the lowest of a label's engines) and upstream: the
// queue's without a pool, each upstream's with one (a share left in the
// store from before a reload changed the pool is not in force).
func collectAdaptive(ch chan<- prometheus.Metric, engines []*engine) {
	type key struct{ label, upstream string }
	out := map[key]float64{}
	for _, e := range engines {
		cfg := e.q.Config()
		if cfg.Adaptive == nil {
			continue
		}
		label := e.label(cfg)
		for up, s := range e.q.Shares() {
			if !shareInForce(cfg, up) {
				continue
			}
			k := key{label, up}
			if cur, ok := out[k]; !ok || s < cur {
				out[k] = s
			}
		}
	}
	for k, s := range out {
		if k.upstream == "" {
			ch <- prometheus.MustNewConstMetric(descCapacityShare, prometheus.GaugeValue, s, k.label)
		} else {
			ch <- prometheus.MustNewConstMetric(descUpstreamCapacityShare, prometheus.GaugeValue, s, k.label, k.upstream)
		}
	}
}

// shareInForce reports whether the learned share of key ("": the queue's, else
// an upstream's dial) applies under cfg: the queue's without a pool, each
// pool upstream's with one (fairqueue.Limits.Scale).
func shareInForce(cfg fairqueue.Config, key string) bool {
	if len(cfg.Upstreams) == 0 {
		return key == ""
	}
	return slices.ContainsFunc(cfg.Upstreams, func(u fairqueue.Upstream) bool { return u.Dial == key })
}
