// Package caddyfairqueue is the Caddy v2 module http.handlers.fair_queue
// and its Caddyfile directive fair_queue: a cluster-wide fair queue in
// front of backends that can serve only so many requests at once (LLM
// servers). Requests beyond the permits wait in one queue, kept in Redis
// and shared by every Caddy instance, or kept in the process for a single
// instance; they are served in arrival order (or fairly across tenants)
// and continue to the next handler (reverse_proxy) the moment a permit
// frees anywhere; those that wait too long get a clear answer, JSON or a
// server-sent event.
//
// The queue itself is package fairqueue, usable without Caddy; this
// package is the Caddy glue.
package caddyfairqueue

import (
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Defaults of the handler's options.
const (
	// DefaultName is the queue name when none is given.
	DefaultName = "default"
	// DefaultMaxBody is the largest request body read, 8 MiB.
	DefaultMaxBody = 8 << 20
	// DefaultBodyTimeout bounds the arrival of a request body.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultMaxWaitingBytes bounds the bodies of the requests waiting
	// in one process, 256 MiB.
	DefaultMaxWaitingBytes = 256 << 20
	// DefaultMaxCost bounds the cost of one request with cost max_tokens
	// or tokens.
	DefaultMaxCost = 32768
	// DefaultMaxTokens is the completion budget of a request whose body
	// sets none, unless Handler.DefaultMaxTokens says otherwise, until
	// its queue has learned one from the answers.
	DefaultMaxTokens = 1024
	// DefaultAbortGrace is how long the permit of a request whose client
	// left while the upstream ran it stays held once reverse_proxy returns,
	// unless AbortGrace says otherwise. Clients that leave together (a load
	// balancer or a batch job cut off) are not seen leaving together: the
	// server learns of each closed connection when it reads it, some
	// milliseconds apart on a busy instance, and the upstream still runs the
	// aborted request until it notices its closed connection. Handed on at
	// once, the permit would go to a waiter whose client is gone but not yet
	// seen gone, forwarded beside the aborted request. A client that leaves
	// costs its permit this long; a served request costs nothing.
	DefaultAbortGrace = 50 * time.Millisecond
)

// Handler holds each request in a cluster-wide fair queue until one of
// the queue's permits is free, then passes it to the next handler
// (normally reverse_proxy) and keeps the permit until that handler has
// written the whole response, streams included.
//
// Before queueing it reads the whole request body (see MaxBody) and the
// top-level "model", "stream" and max tokens keys of a JSON body; the
// next handler receives the same bytes.
//
// It sets these placeholders, for logs and later handlers:
//
//	{http.fair_queue.queue}        the queue name (Name, placeholders replaced)
//	{http.fair_queue.model}        the "model" of the JSON request body, or empty
//	{http.fair_queue.streaming}    true for a streaming request (Accept: text/event-stream or "stream": true, not on an endpoint that never streams; Ollama's /api/chat and /api/generate unless "stream": false)
//	{http.fair_queue.tenant}       with Tenant: the tenant's key, a hash of its value (never the value itself, which may be an API key)
//	{http.fair_queue.outcome}      granted, fail_open, cancelled, model_not_found or model_missing (see Names), or the reject reason
//	{http.fair_queue.reason}       the reject reason; store_unavailable for fail_open, model_not_found or model_missing (see Names)
//	{http.fair_queue.wait_ms}      time spent waiting for the permit, in milliseconds
//	{http.fair_queue.position}     tickets ahead at enqueue plus one; 0 when granted at once
//	{http.fair_queue.upstream}     with Upstreams: the dial address of the granted upstream
//
// The access log has a "fair_queue" object: queue, outcome, reason,
// wait_ms, position, tenant (with Tenant) and upstream (with Upstreams).
type Handler struct {
	// Name of the queue. Every handler, on every Caddy instance, that
	// names the same queue in the same store (for Redis: address,
	// database and key prefix; without Redis: this process) shares its
	// permits and its order. Placeholders are replaced per request, so
	// that one handler can keep a queue per model
	// ({http.fair_queue.model}) or per header; such a handler holds at
	// most 100 queues (or as many as Names lists) and gives back a queue
	// that has had no request in it for 10s, at once when a new name
	// needs its slot: a request naming a new queue while every slot has
	// a request in it, a name longer than 200 bytes, or "(overflow)" or
	// "(unknown)" (the labels of requests refused without a queue), is
	// rejected with queue_full (it appears in logs and metrics as
	// "(overflow)"). A name that resolves to nothing is "default".
	// Default "default".
	Name string `json:"name,omitempty"`

	// Names lists the queue names (Name with its placeholders replaced)
	// that the handler serves: a request whose name is not listed is
	// answered at once with 404 and code model_not_found, as OpenAI
	// answers an unknown model, and opens no queue, so names a client
	// makes up never take a queue slot. Where Name is the model's
	// ({http.fair_queue.model}), a request that names no model (no
	// "model" in its JSON body, a body that is not JSON, no body) is
	// answered 400 with code model_missing, as early. Each name once, 1
	// to 200 bytes. Requires a Name with placeholders. Default: none, any
	// name opens a queue.
	Names []string `json:"names,omitempty"`

	// Permits is how many requests of the queue may be served at once,
	// across the whole cluster. Required unless Upstreams or KVTokens
	// bound the queue; at least 1. During a rolling config change each
	// instance applies its own value to the calls it makes.
	Permits int `json:"permits,omitempty"`

	// KVTokens is the KV-cache tokens the queue's running requests may
	// hold at once, across the cluster: a request is granted only when
	// its weight (its estimated prompt tokens plus its completion budget
	// per completion, see DefaultMaxTokens) fits beside the weights of the requests
	// running, and a permit is free when Permits is also set. Set it to
	// the backend's KV cache size in tokens (vLLM logs its "# GPU blocks"
	// at startup: times the block size, 16 by default). A request heavier
	// than the whole capacity is clamped to it, and so runs alone. With
	// Upstreams each upstream may set its own (upstreams[].kv_tokens);
	// this then caps the pool as a whole, and defaults to their sum when
	// every upstream sets one. Default 0: tokens are not counted, and
	// Permits alone bounds the queue; with KVTokens, Permits may be left
	// out.
	KVTokens int `json:"kv_tokens,omitempty"`

	// Adaptive, when set, makes the queue learn its capacity from the
	// backend's time to first token: the capacity in force is a learned
	// share of Permits, KVTokens and each upstream's, one value for every
	// instance, kept in the queue's store (see AdaptiveConfig).
	Adaptive *AdaptiveConfig `json:"adaptive,omitempty"`

	// DefaultMaxTokens is the completion budget of a request whose body
	// sets none (max_completion_tokens, max_output_tokens, max_tokens; on
	// Ollama's native API, options.num_predict): the tokens it is expected to
	// generate at most, part of its weight with KVTokens and of its
	// charge with Cost "tokens". An embeddings request (/v1/embeddings,
	// Ollama's /api/embed and /api/embeddings) generates none: its budget
	// is 0. Unset, the budget is learned per queue from the answers to
	// the requests that set none (their usage: total less prompt tokens):
	// the 95th percentile of the tokens the last 256 generated, once 20
	// are seen, and 1024 (the package's DefaultMaxTokens) before. Set, it
	// is fixed. At least 1. Requires KVTokens (on the queue or an
	// upstream) or Cost "tokens".
	DefaultMaxTokens int `json:"default_max_tokens,omitempty"`

	// MediaTokens is the prompt tokens each part of a prompt that is not
	// text is weighed at (an image or audio content part of a message or
	// Responses API input item, sent inline as base64 or by URL, a file;
	// each of Ollama's "images"), which the backend counts and the
	// body's text does not show: part of the weight with KVTokens and of
	// the charge with Cost "tokens". Set it to what the model makes of
	// the media its clients send (vLLM reports it in the answer's
	// usage.prompt_tokens). Default 1024 (the package's
	// DefaultMediaTokens). At least 1. Requires KVTokens (on the queue or
	// an upstream) or Cost "tokens".
	MediaTokens int `json:"media_tokens,omitempty"`

	// MaxWait is the longest a request waits for a permit before it is
	// rejected with reason timeout. Default 20s; at least 50ms (the
	// smallest PollInterval).
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// PollInterval is how often an instance with waiters checks the
	// queue in the store, the safety net for lost wake-ups and expired
	// leases (permits normally move at once, by notification). Default
	// 200ms, or MaxWait when that is shorter; at least 50ms and at most
	// MaxWait.
	PollInterval caddy.Duration `json:"poll_interval,omitempty"`

	// MaxBody is the largest request body, in bytes, that the handler
	// reads before queueing; a larger one is answered with 413 at once.
	// The body is held in memory while the request waits. Default 8 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// BodyTimeout is how long the request body may take to arrive, in
	// full, from the moment the handler starts reading it: a client
	// slower than that (one that declares a large body and trickles it,
	// or stalls) is answered 408 with an OpenAI-style error
	// (request_timeout) and its connection closed. It bounds only the
	// body: it is lifted once the body is read, so it never cuts a
	// response, and it is separate from MaxWait, which starts after it.
	// Caddy's own read timeouts (read_body, the read idle timeout) still
	// apply. Default 30s (MaxBody's 8 MiB at 2.3 Mbit/s); at least
	// 100ms.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`

	// MaxWaitingBytes bounds the memory that waiting requests hold: the
	// size of the bodies of the requests waiting for a permit in this
	// Caddy process, every fair_queue handler and queue together, each
	// with its head (its target, and its header and trailer fields at
	// their name, value and 64 bytes each; trailers the handler cannot
	// see, over HTTP/3 or over HTTP/2 where some are announced, at the
	// server's max_header_bytes) and 32 KiB, what a waiting request holds
	// whatever its size. A request whose body and head would take
	// that sum beyond this handler's value
	// is rejected at once with reason queue_full (429 and Retry-After by
	// default). A body counts from its read until its request is granted
	// (one granted at once counts for the store's round trip) or leaves
	// the queue, and again while a requeued request waits anew (never
	// refused). Default 256 MiB (or MaxBody when larger); at least MaxBody.
	MaxWaitingBytes int64 `json:"max_waiting_bytes,omitempty"`

	// Lease is how long a permit stays held without renewal. Instances
	// renew the leases of their permits every Lease/3, so a crashed
	// instance's permits come back after at most Lease; a running
	// response is never cut. Default 30s, at least 1s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// AbortGrace is how long the permit of a request whose client left
	// while the upstream ran it stays held after reverse_proxy returns,
	// before it is handed to the next waiter. The upstream still runs an
	// aborted request until it notices the closed connection (a model
	// server notices a stream's at its next token, a plain request's when
	// it next checks its connection or writes the answer); a permit handed
	// on sooner lets the upstream run one request more than the permits.
	// Set it to the longest an upstream takes to stop an aborted request.
	// Only requests whose client left pay it. Default 50ms; at least 1ms,
	// at most 1m;
	// a negative value (Caddyfile "off") hands the permit on at once.
	AbortGrace caddy.Duration `json:"abort_grace,omitempty"`

	// Tenant is a placeholder expression naming who a request is for,
	// such as {http.request.header.X-Tenant-Id} set by forward_auth,
	// {http.auth.user.id} or {http.request.remote.host}: an identity the
	// client cannot choose per request. Setting it makes the queue fair
	// across tenants: FIFO inside each tenant, tenants interleaved by what
	// they were charged (see Cost) so that one sending ten times the
	// requests of another does not get ten times the permits. The value
	// is replaced per request, cut to its first 1 KiB (longer values that
	// share those bytes are one tenant) and hashed before it reaches the
	// store or any log; an empty value is one default tenant. A request
	// in TLS early data (HTTP/3's 0-RTT), its client's address unknown
	// until the handshake, is answered 425 Too Early (its client sends it
	// again then). Default: none, strict FIFO.
	Tenant string `json:"tenant,omitempty"`

	// Weights gives tenants a share of the permits relative to others: a
	// tenant of weight 2 gets twice the grants of one of weight 1 when
	// both wait. A key is the tenant's key, "sha256:" and 16 lowercase hex
	// digits (the first 16 of the SHA-256 of the tenant's value, the hash
	// access logs and the admin API show; `caddy fair-queue tenant-key`
	// prints it), which keeps a secret value such as an API key out of
	// the config; or the tenant's value itself (Tenant replaced, exactly;
	// at most 1 KiB); either may be a placeholder known at load, such as
	// {env.GOLD_KEY}, replaced then. A malformed "sha256:" key is an error, and a tenant
	// may be listed once, by value or by key. Each weight is 0.01 to
	// 1000. A tenant listed here takes this weight, whatever
	// WeightPlaceholder says. Requires Tenant.
	Weights map[string]float64 `json:"weights,omitempty"`

	// WeightPlaceholder is a placeholder expression giving the weight of
	// a request's tenant as a number (for example a header set by an
	// authentication layer), for tenants not listed in Weights. A value
	// that is absent or not a number is 1; others are bounded to 0.01 to
	// 1000. Requires Tenant.
	WeightPlaceholder string `json:"weight_placeholder,omitempty"`

	// Cost is what a request is charged to its tenant's share, which
	// orders the tenants (the backlogged tenant charged the least so far,
	// per weight, is served next). One of:
	//
	//   - "requests" (or "", the default): every request costs 1; tenants
	//     get equal numbers of grants.
	//   - "max_tokens": the top-level max_tokens (or max_completion_tokens,
	//     max_output_tokens; the largest) of the JSON request body, or on
	//     Ollama's native API (/api/chat, /api/generate) its
	//     options.num_predict, the only one it reads (1 when it sets
	//     none), times its completions (the larger of n and best_of,
	//     times the prompts of a prompt batch; Ollama's native API
	//     generates one), bounded to 1 to MaxCost. Charged at the grant,
	//     never corrected.
	//   - "time": the seconds the request holds its permit, from the
	//     grant to the end of its response (streams included). At the
	//     grant it is charged an estimate, the moving average
	//     (alpha 0.2, 1s before the first request; one average per
	//     handler, started again at each config load) of the holds of
	//     this handler's recent requests; at the release the charge is
	//     corrected to the real hold. Takes no MaxCost: a hold is
	//     charged in full (at most 1000000 s).
	//   - "tokens": tokens. At the grant, the request's weight as
	//     KVTokens counts it: its prompt text's bytes divided by the
	//     bytes per token the queue learned from answers (4 before the
	//     first), rounded up (a body with no messages, prompt, system, instructions or
	//     input counts all its bytes), plus its completion budget
	//     (max_completion_tokens, max_output_tokens, max_tokens, or on
	//     Ollama's native API options.num_predict, else DefaultMaxTokens)
	//     times its completions (the larger of n and best_of, times the
	//     prompts of a prompt batch), bounded to 1 to MaxCost. At the release
	//     it is corrected to the response's usage.total_tokens (bounded to
	//     MaxCost): from a JSON body (Content-Type application/json, up to
	//     1 MiB), or from the last server-sent event (Content-Type
	//     text/event-stream) whose data carries a usage object with
	//     total_tokens (OpenAI sends one with
	//     "stream_options":{"include_usage":true}; a Responses API
	//     event's response.usage counts too; of a data line longer than
	//     64 KiB the last 16 KiB are read). A response without usage, or with a
	//     Content-Encoding, keeps the estimate. The response is passed
	//     on as it comes, never held back.
	//
	// Requires Tenant or Priority.
	Cost string `json:"cost,omitempty"`

	// MaxCost bounds the cost of one request with Cost "max_tokens" or
	// "tokens" (with "tokens" both the estimate and the usage charged),
	// so that one request cannot push its tenant far back. Default
	// 32768, at most 1000000. Only with those two modes.
	MaxCost int `json:"max_cost,omitempty"`

	// Priority is a placeholder expression giving a request's priority
	// band, 0 (the default, lowest) to 3; a value that is absent or not
	// an integer is 0, others are clamped. A higher band is served first,
	// but never starves the ones below: when several bands wait, each
	// band gets PriorityFactor times the grants of the band below it.
	// Clients must not be able to choose their band: take it from a value
	// an authentication layer sets. Setting it makes the queue fair
	// (see Tenant) even without Tenant.
	Priority string `json:"priority,omitempty"`

	// PriorityFactor is how many times as many grants a priority band
	// gets as the band below it while both wait. Default 8, at least 2.
	PriorityFactor float64 `json:"priority_factor,omitempty"`

	// MaxQueue caps the requests waiting in the queue, across the
	// cluster; one more is rejected at once with reason queue_full (429
	// and Retry-After by default). Default 0: no cap.
	MaxQueue int `json:"max_queue,omitempty"`

	// MaxQueuePerTenant caps the requests of one tenant waiting in one
	// priority band; one more is rejected at once with reason
	// queue_full. Requires Tenant. Default 0: no cap.
	MaxQueuePerTenant int `json:"max_queue_per_tenant,omitempty"`

	// MaxInFlightPerTenant caps the permits one tenant holds at once,
	// across the cluster and all its priority bands: its further requests
	// wait (up to MaxWait, as any other) while other tenants' requests
	// are served past them, and are served again as soon as one of its
	// requests ends. With Priority but no Tenant every request is one
	// tenant, so this caps the queue's running requests below Permits.
	// Handlers of one config that name one queue must agree on it. Requires
	// Tenant or Priority. Default 0: no cap.
	MaxInFlightPerTenant int `json:"max_in_flight_per_tenant,omitempty"`

	// Upstreams is a pool of backends for the queue, each with its own
	// permits: a grant names one of them, the one with the most free
	// permits relative to its size, and none ever runs more than its
	// permits across the cluster. reverse_proxy sends the request to the
	// granted upstream with `dynamic fair_queue` (module
	// http.reverse_proxy.upstreams.fair_queue). With Upstreams, Permits
	// defaults to the sum of their permits and, when also given, caps
	// the pool as a whole. Each dial address ("10.0.0.5:8000", as
	// reverse_proxy dials it) is listed once, with at least 1 permit;
	// every instance should list the same upstreams. Default: none, the
	// queue has one pool of Permits and reverse_proxy routes alone.
	Upstreams []fairqueue.Upstream `json:"upstreams,omitempty"`

	// RequeueOn lists upstream statuses (400 to 599, such as 429 and
	// 503) that mean "overloaded, try elsewhere": such an answer is not
	// passed on (neither its header nor its body reach the client); the
	// upstream cools (is left out of dispatch, cluster-wide) for its
	// Retry-After, in seconds or an HTTP date, at most 5 minutes, or for
	// UpstreamCooldown without one; and the request goes back into the
	// queue at its place (not the tail) with its body unchanged, to be
	// granted again, maybe on another upstream, within its MaxWait (the
	// usual timeout reject after that). Once MaxRequeues are spent the
	// next answer is passed on unchanged. Requires Upstreams. Default:
	// none.
	RequeueOn []int `json:"requeue_on,omitempty"`

	// MaxRequeues is how many times one request is sent back into the
	// queue, after a RequeueOn status or an upstream that could not be
	// reached (a dial failure or timeout: reverse_proxy's 502 or 504
	// before anything was written). 0 turns requeueing off (the upstream
	// still cools). Default 3 (null or absent), at most 100. Requires
	// Upstreams.
	MaxRequeues *int `json:"max_requeues,omitempty"`

	// UpstreamCooldown is how long an upstream is left out of dispatch,
	// cluster-wide, after it could not be reached, and after a RequeueOn
	// status without Retry-After. Default 1s; at least 1ms, at most 5m. Requires
	// Upstreams.
	UpstreamCooldown caddy.Duration `json:"upstream_cooldown,omitempty"`

	// Redis is where the queues live, shared by every Caddy instance that
	// names the same Redis. Without it each queue lives in this process
	// alone: the same semantics, for a single Caddy instance (startup
	// logs say so once per queue).
	Redis *RedisConfig `json:"redis,omitempty"`

	// OnStoreError is the policy for a request that finds Redis
	// unreachable (its call fails, or earlier consecutive failures marked
	// Redis down and no call is tried until one succeeds again):
	// "fail_open" admits it without a permit (the outage is logged, and
	// counted in the fail_open outcome); "fail_closed" rejects it with
	// reason store_unavailable (503); "local" queues it in this instance
	// alone, with LocalPermits permits, until Redis is back and the
	// instance's heartbeat (at its next poll) has counted there its local
	// permits still running (until then another instance's requests may
	// be granted beside them). Requests waiting keep waiting until
	// MaxWait either way. Without Redis it has no effect. Default
	// "fail_open".
	OnStoreError string `json:"on_store_error,omitempty"`

	// LocalPermits is the permits of OnStoreError "local"'s queue in this
	// instance, with that share of KVTokens (KVTokens / live instances where
	// KVTokens alone bounds the queue). 0: this instance's part of Permits
	// split among the live instances (parts within one of each other that
	// add up to Permits), >= 1, and of each pool upstream's permits
	// likewise. The instance's requests Redis granted that still run when
	// it goes away count against them until they end.
	LocalPermits int `json:"local_permits,omitempty"`

	// Reject shapes the answers to requests that get no permit, per
	// reason. See RejectConfig for the defaults.
	Reject []*RejectConfig `json:"reject,omitempty"`

	// SSEKeepalive, when set, keeps a streaming request (Accept:
	// text/event-stream, or "stream": true in the JSON body; on Ollama's
	// native API, one without "stream": false, fed NDJSON) that has
	// waited this long in the queue from being cut by an idle timeout
	// of a proxy or CDN on the way: the handler sends the response's
	// header (200, Content-Type text/event-stream, Cache-Control
	// no-cache, X-Accel-Buffering no) and then an SSE comment, such as
	// ": queued waited=12s", every interval until the request is
	// granted or rejected. Every SSE client ignores comments. Once the
	// header is sent the upstream's status and header cannot be: when
	// granted, the upstream's body is relayed as it comes (a status other
	// than 2xx becomes an SSE "error" event whose data is the upstream's
	// JSON error, or a default error object); a reject
	// becomes the reject's SSE event (see RejectConfig; its sse_status
	// and headers no longer apply, so the reason is only in the event's
	// data). At least 100ms and shorter than MaxWait. Default 0: off.
	SSEKeepalive caddy.Duration `json:"sse_keepalive,omitempty"`

	// SSEQueueEvents adds to each keepalive comment a named event,
	// "event: queue" with data {"position":N,"eta_s":T,"waited_s":W}
	// (position and eta_s are null while the queue cannot tell them).
	// Off by default: OpenAI SDKs hand events they do not know to the
	// caller as if they were completion chunks. Requires SSEKeepalive.
	SSEQueueEvents bool `json:"sse_queue_events,omitempty"`

	// RejectStream records each reject in a Redis stream, for the
	// application to act on. Requires Redis. Default: off.
	RejectStream *RejectStreamConfig `json:"reject_stream,omitempty"`

	logger    *zap.Logger
	backend   backend
	policies  map[fairqueue.Reason]*rejectPolicy
	rejects   *rejectStream     // with RejectStream
	dynamic   bool              // Name has placeholders
	gen       uint64            // provisioning number
	load      <-chan struct{}   // its config load (ctx.Done, see claims): namesakes.use
	srv       *caddyhttp.Server // its server, if any: what follows it there (reloadapply.go)
	claim     *claimKey
	claimants *claimants   // its config's handlers naming its queue (under claims' lock)
	fromReq   *fromRequest // its config's handlers naming queues from the request (claims)
	names     map[string]bool

	mu      sync.Mutex
	engines map[engineKey]*engineRef // the pool references this handler holds
	cleaned bool
	// exiting: the server began shutting down for the process's exit
	// (onShutdown): a queue the handler opens from then on answers its
	// waiters at once, as the queues it held then did.
	exiting     bool
	borrowed    map[engineKey]bool // after cleanup: the queues it held or requests borrowed
	capOnce     sync.Once          // logs the queue cap once
	waitingOnce sync.Once          // logs once that max_waiting_bytes was reached

	hold    holdAverage        // cost time: the estimate of a request's hold
	charged func(used float64) // tests: sees each Permit.Charge
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Destructor            = (*engine)(nil)
	_ caddy.Destructor            = (*redisClient)(nil)
)
