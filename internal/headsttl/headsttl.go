// Package headsttl holds the lifetime of the heads a store's reply names
// under a learned capacity (fairqueue.HeadsTTL): how long they serve
// local handoffs, and how long the stores hold another node's lowering
// of the queue's share back after naming them. The queue and the stores
// read it through Of, which returns fairqueue.HeadsTTL unless a test
// lengthened it (Lengthen), so that what a test checks within it does
// not depend on how fast the machine runs. Being internal, it is out of
// users' reach: for them the lifetime is always fairqueue.HeadsTTL.
package headsttl

import (
	"sync/atomic"
	"time"
)

// lengthened is the lifetime a test set (Lengthen), 0 where none did.
var lengthened atomic.Int64

// Of returns ttl, the product's lifetime of the heads
// (fairqueue.HeadsTTL), or the one a test set with Lengthen.
func Of(ttl time.Duration) time.Duration {
	if d := time.Duration(lengthened.Load()); d > 0 {
		return d
	}
	return ttl
}

// Lengthen makes Of return d in every queue and store of the process
// until restore is called, which brings back the lifetime in force
// before. For tests only, and for those that run alone (not
// t.Parallel): every queue and store of the process reads it.
func Lengthen(d time.Duration) (restore func()) {
	old := lengthened.Swap(int64(d))
	return func() { lengthened.Store(old) }
}
