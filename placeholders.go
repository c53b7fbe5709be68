package caddyfairqueue

// Placeholders the handler sets on every request it queues (see Handler;
// retry_after and message: a reject's, see RejectConfig).
const (
	phQueue      = "http.fair_queue.queue"
	phModel      = "http.fair_queue.model"
	phStreaming  = "http.fair_queue.streaming"
	phTenant     = "http.fair_queue.tenant" // the tenant's key (a hash), never its value
	phOutcome    = "http.fair_queue.outcome"
	phReason     = "http.fair_queue.reason"
	phWaitMS     = "http.fair_queue.wait_ms"
	phPosition   = "http.fair_queue.position"
	phRetryAfter = "http.fair_queue.retry_after"
	phMessage    = "http.fair_queue.message"
	phUpstream   = "http.fair_queue.upstream" // with Upstreams: the granted upstream's dial address
)
