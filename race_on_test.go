//go:build race

package caddyfairqueue

// waiterHeldFactor is how many times what max_waiting_bytes counts of a
// waiter it may hold in TestWaitersOverEachProtocolHoldAboutWhatTheyCount:
// under the race detector every goroutine's stack and the runtime's
// records of its heap are larger (TLS HTTP/1 waiters: 52 KiB each
// without it, 69-71 KiB with it, against 33 KiB counted).
const waiterHeldFactor = 3
