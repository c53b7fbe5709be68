package caddyfairqueue

// On-store-error policies.
const (
	// FailOpen admits requests without a permit while the store is
	// unreachable.
	FailOpen = "fail_open"
	// FailClosed rejects requests with store_unavailable while the store
	// is unreachable.
	FailClosed = "fail_closed"
	// FailLocal queues requests in this instance alone, with
	// LocalPermits permits, while the store is unreachable.
	FailLocal = "local"
)

// checkOnStoreError is the rule of OnStoreError (set, not defaulted).
func checkOnStoreError(policy string) error {
	return checkOneOf("on_store_error", policy, FailOpen, FailClosed, FailLocal)
}
