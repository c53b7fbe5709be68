package caddyfairqueue

// An option spelt right but written in the wrong block (adaptive's
// target_ttft at the top of fair_queue, the queue's kv_tokens inside
// redis) is refused as any unknown option is; the error then names the
// block it belongs to, since "unrecognized subdirective" alone reads as
// a misspelling.

// optionBlocks maps each option of fair_queue's Caddyfile blocks to the
// block that takes it ("" for fair_queue's own block). It lists what the
// parsers take (UnmarshalCaddyfile, parseAdaptive, parseRedis,
// parseReject, parseRejectStream); an option missing here only goes
// without the hint. TestCaddyfileOptionBlocksTakeTheirOptions checks that
// each block takes the options listed for it.
var optionBlocks = map[string]string{
	"name": "", "names": "", "permits": "", "kv_tokens": "", "default_max_tokens": "", "media_tokens": "", "adaptive": "",
	"max_wait": "", "poll_interval": "", "lease": "", "abort_grace": "", "max_body": "", "body_timeout": "",
	"tenant": "", "weight": "", "weight_placeholder": "", "cost": "", "priority": "", "priority_factor": "",
	"max_queue": "", "max_queue_per_tenant": "", "max_in_flight_per_tenant": "", "max_waiting_bytes": "",
	"on_store_error": "", "local_permits": "", "redis": "", "sse_keepalive": "", "sse_queue_events": "",
	"reject_stream": "", "upstream": "", "requeue_on": "", "max_requeues": "", "upstream_cooldown": "",
	"reject": "",

	"target_ttft": "adaptive", "floor": "adaptive", "interval": "adaptive", "decrease": "adaptive",
	"step": "adaptive", "breach_share": "adaptive", "min_samples": "adaptive", "backend_metrics": "adaptive",

	"url": "redis", "mode": "redis", "master_name": "redis", "sentinel_username": "redis",
	"sentinel_password": "redis", "address": "redis", "username": "redis", "password": "redis", "db": "redis",
	"tls": "redis", "key_prefix": "redis", "dial_timeout": "redis", "read_timeout": "redis",
	"write_timeout": "redis",

	"status": "reject", "sse_status": "reject", "retry_after": "reject", "body": "reject",
	"sse_event": "reject", "sse_data": "reject",

	"maxlen": "reject_stream", "field": "reject_stream",
}

// blockHint returns ` (an option of the <block> block)` for an option
// that another of fair_queue's blocks takes, or "" for a name no block
// takes. It is asked only about an option the block being parsed does
// not take.
func blockHint(opt string) string {
	block, ok := optionBlocks[opt]
	switch {
	case !ok:
		return ""
	case block == "":
		return " (an option of fair_queue itself, not of this block)"
	default:
		return " (an option of the " + block + " block)"
	}
}
