package caddyfairqueue

// Per-upstream counters of a queue with a pool (Handler.Upstreams).

// observeRequeue counts a request that upstream answered with a
// requeue_on status (or failed to connect to), sent back into the queue.
// reason is the upstream's status code ("503") or "unreachable".
func observeRequeue(queue, upstream, reason string) {}

// observeCooldown counts a cooldown of upstream asked by this instance.
func observeCooldown(queue, upstream string) {}
