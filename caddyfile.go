package caddyfairqueue

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("fair_queue", parseCaddyfile)
	// The queue must let a request through before it is proxied. Note
	// that handle, route and respond still come first: put fair_queue in
	// the same block as reverse_proxy.
	httpcaddyfile.RegisterDirectiveOrder("fair_queue", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	fq := new(Handler)
	if err := fq.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return fq, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	fair_queue [<matcher>] {
//	    name          <queue name>         # default "default"; placeholders allowed, e.g. {http.fair_queue.model}
//	    names         <name>...            # repeatable; with placeholders in name: the names served, others get 404 model_not_found, no model 400
//	    permits       <n>                  # required (unless upstream lines or kv_tokens), > 0, cluster-wide
//	    kv_tokens     <n>                  # KV-cache tokens the running requests may hold, cluster-wide; default 0: not counted
//	    default_max_tokens <n>             # completion budget of a body without max_tokens; default learned
//	    media_tokens  <n>                  # prompt tokens of each image or audio part of a prompt; default 1024
//	    adaptive {                         # learn the capacity from the backend's time to first token (docs/adaptive.md)
//	        target_ttft  <duration>        # required: keep the TTFT p99 at or below this
//	        floor        <share>           # least share of permits / kv_tokens in force, (0, 1]; default 0.0625
//	        interval     <duration>        # how often the capacity may move, cluster-wide; default 1s, at least 100ms
//	        decrease     <factor>          # share x this on a breach (or a 429/503), (0, 1); default 0.9
//	        step         <share>           # share + this after an interval under target while requests waited, (0, 1]; default 0.015625
//	        breach_share <share>           # share of TTFTs above target that is a breach, (0, 1); default 0.01
//	        min_samples  <n>               # TTFTs a window needs before the target is judged, at least 1; default 1/breach_share within 10..100
//	        backend_metrics <path>|<url>   # read the backend's vLLM or SGLang gauges every interval: a path on each pool upstream, or the URL of the one backend
//	    }
//	    max_wait      <duration>           # default 20s; at least 50ms
//	    poll_interval <duration>           # default 200ms (max_wait if shorter); at least 50ms, at most max_wait
//	    max_body      <size>               # default 8MiB (e.g. 1MiB, 512KB); larger bodies get 413
//	    body_timeout  <duration>           # default 30s; at least 100ms; a body not read in full by then gets 408
//	    max_waiting_bytes <size>           # bodies, heads and 32KiB each of waiting requests, this process; beyond: 429 queue_full. default 256MiB, at least max_body
//	    lease         <duration>           # default 30s; at least 1s
//	    abort_grace   <duration>|off       # a permit's hold after its client left mid-answer; default 50ms, at most 1m
//
//	    # fairness across tenants; without tenant and priority: strict FIFO
//	    tenant        <placeholders>       # e.g. {http.request.header.X-Tenant-Id} set by forward_auth; hashed, cut at 1KiB
//	    weight        <tenant> <w>         # repeatable; 0.01-1000, default 1; requires tenant
//	                                       # tenant: sha256:<16 hex> (recommended: its key, as logs show it) or the raw value; {env.*} replaced at load
//	    weight_placeholder <placeholders>  # a number per request, for tenants without a weight line
//	    cost          requests|max_tokens [<max>]|time|tokens [<max>]   # what a request is charged; default requests (1 each)
//	                                       # max_tokens: the body's max_tokens, 1 to max (default 32768)
//	                                       # time: the seconds the permit is held (estimated, corrected at release)
//	                                       # tokens: the weight (prompt estimate + completion budget, as kv_tokens counts it), 1 to max; corrected to usage.total_tokens
//	    priority      <placeholders>       # band 0 (default) to 3
//	    priority_factor <n>                # default 8, at least 2
//	    max_queue     <n>                  # waiting requests, cluster-wide; beyond: 429 queue_full. default 0: no cap
//	    max_queue_per_tenant <n>           # per tenant and band; requires tenant. default 0: no cap
//	    max_in_flight_per_tenant <n>       # permits one tenant holds at once, cluster-wide; requires tenant or priority. default 0: no cap
//
//	    # a pool of backends, each with its own permits, cluster-wide (see "Upstream pools");
//	    # reverse_proxy takes the granted one with `dynamic fair_queue`; permits then caps the pool (default: the sum)
//	    upstream      <dial address> <n> [kv_tokens <n>]   # repeatable, e.g. upstream 10.0.0.5:8000 8 kv_tokens 200000
//	    requeue_on    <status>...          # e.g. 429 503: answer not passed on, request requeued at its place; requires upstream
//	    max_requeues  <n>                  # per request, 0 to 100; default 3
//	    upstream_cooldown <duration>       # an upstream that failed (no Retry-After) gets no grant for this long; default 1s, at most 5m
//
//	    # no redis block: the queue lives in this process only
//	    redis [<url>] {
//	        mode          standalone|sentinel|cluster   # default standalone
//	        url           redis://[user:pass@]host:port/db   # or rediss://, unix://; standalone only; ?protocol=3 for RESP3 (default RESP2)
//	        address       <host:port>...   # instead of url: the server, the Sentinels or the cluster seeds
//	        master_name   <name>           # sentinel: the monitored master; required
//	        username      <username>
//	        password      <password>       # e.g. {env.REDIS_PASSWORD}
//	        sentinel_username <username>   # sentinel: ACL user of the Sentinels
//	        sentinel_password <password>   # sentinel: password of the Sentinels
//	        db            <n>              # not with cluster
//	        tls
//	        key_prefix    <prefix>         # default "fair_queue"; e.g. {env.DEPLOYMENT}
//	        dial_timeout  <duration>       # default 500ms, at least 1ms
//	        read_timeout  <duration>       # default 500ms, at least 1ms
//	        write_timeout <duration>       # default 500ms, at least 1ms
//	    }
//
//	    on_store_error fail_open|fail_closed|local   # default fail_open
//	    local_permits <n>                  # with local; default its share of what is free and what it held (failures.md)
//
//	    # no reason: defaults for every reason; repeat per reason
//	    reject [timeout|queue_full|shutting_down|store_unavailable...] {
//	        status      <code>             # default 429 (timeout, queue_full), 503 (shutting_down, store_unavailable)
//	        retry_after <duration>|auto    # default auto
//	        body        <template>         # default: {"error":{"message":...,"type":...,"code":<reason>}}
//	        sse_status  <code>             # streaming requests; default 200
//	        sse_event   <name>             # default "error"
//	        sse_data    <template>         # default: body, or the default error object
//	    }
//
//	    # streaming requests that wait: send the 200 event-stream header
//	    # and an SSE comment every interval; default off
//	    sse_keepalive <interval>           # at least 100ms, shorter than max_wait
//	    sse_queue_events                   # also an "event: queue"; requires sse_keepalive
//
//	    # record each reject in a Redis stream; requires redis; default off
//	    reject_stream <key> {
//	        maxlen <n>                     # about n entries kept (MAXLEN ~); default 10000
//	        field  <name> <template>       # repeatable, e.g. field conversation {http.request.header.X-Conversation-Id}
//	    }
//	}
//
// Every option may be given once, except weight (once per tenant value),
// upstream (once per dial address), names and reject. Templates may span lines with a heredoc (<<JSON ... JSON).
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	err := parseBlock(d, map[string]optionParser{
		"name":                     opt(&h.Name, stringArg),
		"names":                    h.parseNames,
		"permits":                  opt(&h.Permits, intRangeArg(1, fairqueue.MaxPermits)),
		"kv_tokens":                opt(&h.KVTokens, intArg(1)),
		"default_max_tokens":       opt(&h.DefaultMaxTokens, intArg(1)),
		"media_tokens":             opt(&h.MediaTokens, intArg(1)),
		"adaptive":                 opt(&h.Adaptive, parseAdaptive),
		"max_wait":                 opt(&h.MaxWait, durationArg(fairqueue.MinPollInterval)),
		"poll_interval":            opt(&h.PollInterval, durationArg(fairqueue.MinPollInterval)),
		"lease":                    opt(&h.Lease, durationArg(fairqueue.MinLease)),
		"abort_grace":              opt(&h.AbortGrace, within(offDurationArg, checkAbortGrace)),
		"max_body":                 opt(&h.MaxBody, sizeArg),
		"body_timeout":             opt(&h.BodyTimeout, durationArg(minBodyTimeout)),
		"tenant":                   opt(&h.Tenant, stringArg),
		"weight":                   h.parseWeight,
		"weight_placeholder":       opt(&h.WeightPlaceholder, stringArg),
		"cost":                     h.parseCost,
		"priority":                 opt(&h.Priority, stringArg),
		"priority_factor":          opt(&h.PriorityFactor, floatArg(2, math.Inf(1))),
		"max_queue":                opt(&h.MaxQueue, intArg(0)),
		"max_queue_per_tenant":     opt(&h.MaxQueuePerTenant, intArg(0)),
		"max_in_flight_per_tenant": opt(&h.MaxInFlightPerTenant, intArg(0)),
		"max_waiting_bytes":        opt(&h.MaxWaitingBytes, sizeArg),
		"on_store_error":           checkedOpt(&h.OnStoreError, checkOnStoreError),
		"local_permits":            opt(&h.LocalPermits, intArg(1)),
		"redis":                    opt(&h.Redis, parseRedis),
		"sse_keepalive":            opt(&h.SSEKeepalive, durationArg(minSSEKeepalive)),
		"sse_queue_events":         flagOpt(&h.SSEQueueEvents),
		"reject_stream":            opt(&h.RejectStream, parseRejectStream),
		"upstream":                 h.parseUpstream,
		"requeue_on":               h.parseRequeueOn,
		"max_requeues":             h.parseMaxRequeues,
		"upstream_cooldown":        opt(&h.UpstreamCooldown, within(durationArg(minDuration), checkCooldown)),
		"reject": func(d *caddyfile.Dispenser) error {
			rc, err := parseReject(d)
			if err != nil {
				return err
			}
			h.Reject = append(h.Reject, rc)
			if _, err := compileRejects(h.Reject); err != nil {
				return d.Err(err.Error())
			}
			return nil
		},
	}, "weight", "reject", "upstream", "names")
	if err != nil {
		return err
	}
	if h.Permits == 0 && len(h.Upstreams) == 0 && h.KVTokens == 0 {
		return d.Err("permits is required (or upstream lines, whose permits add up, or kv_tokens)")
	}
	// The rules that join options: what Provision would refuse.
	if err := h.validate(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// parseWeight parses `weight <tenant> <w>`. The tenant may be a raw
// value, a secret such as an API key: no error echoes an argument (one
// swapped with the weight would be that value); a tenant given twice is
// named by its key.
func (h *Handler) parseWeight(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return d.Errf("weight: wrong argument count: want a tenant (its value or %s<key>) and its weight, got %d arguments", weightHashPrefix, len(args))
	}
	key, err := weightKey(args[0])
	if err != nil {
		return d.Err(err.Error())
	}
	if _, dup := h.Weights[args[0]]; dup {
		return d.Errf("weight: tenant %s%s is given twice", weightHashPrefix, key)
	}
	w, err := strconv.ParseFloat(args[1], 64)
	if err != nil || math.IsNaN(w) || math.IsInf(w, 0) {
		return d.Err("weight: the weight (the second argument) is not a number")
	}
	if w < minWeight || w > maxWeight {
		return d.Errf("weight must be %v to %v, got %v", minWeight, maxWeight, w)
	}
	if h.Weights == nil {
		h.Weights = make(map[string]float64)
	}
	h.Weights[args[0]] = w
	return nil
}

// parseCost parses `cost <mode> [<max>]`: requests, max_tokens [<max>],
// time or tokens [<max>].
func (h *Handler) parseCost(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return argCountErr(d, "cost", "<mode> [<max>]")
	}
	if !slices.Contains(costModes, args[0]) {
		return d.Errf("cost: unknown mode '%s' (want %s)", args[0], strings.Join(costModes, ", "))
	}
	h.Cost = args[0]
	if len(args) == 2 {
		if !takesMax(h.Cost) {
			return d.Errf("cost: mode %s takes no max (only %s and %s do)", h.Cost, CostMaxTokens, CostTokens)
		}
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return d.Errf("cost: max '%s' is not an integer", args[1])
		}
		if n < 1 || n > fairqueue.MaxCost {
			return d.Errf("cost: max must be 1 to %d, got %d", int(fairqueue.MaxCost), n)
		}
		h.MaxCost = n
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
