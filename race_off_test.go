//go:build !race

package caddyfairqueue

// waiterHeldFactor is how many times what max_waiting_bytes counts of a
// waiter it may hold in TestWaitersOverEachProtocolHoldAboutWhatTheyCount.
const waiterHeldFactor = 2
