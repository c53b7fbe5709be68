package mockllm

import (
	"cmp"
	"net/http"
	"sync/atomic"
)

// refusal answers the first requests with an error status, as a model
// server does when it is overloaded or still loading (Config.Refuse).
type refusal struct {
	left       atomic.Int64
	status     int
	retryAfter string
}

func newRefusal(cfg Config) *refusal {
	r := &refusal{status: cmp.Or(cfg.RefuseStatus, http.StatusServiceUnavailable), retryAfter: cfg.RetryAfter}
	r.left.Store(int64(cfg.Refuse))
	return r
}

// Refuse makes the server refuse its next n completion requests (as
// Config.Refuse does at start).
func (s *Server) Refuse(n int) { s.refuse.left.Store(int64(n)) }

// refused answers a completion request with the refusal status while
// refusals are left, and reports whether it did.
func (s *Server) refused(w http.ResponseWriter) bool {
	for {
		n := s.refuse.left.Load()
		if n <= 0 {
			return false
		}
		if s.refuse.left.CompareAndSwap(n, n-1) {
			break
		}
	}
	s.mu.Lock()
	s.stats.Refused++
	s.mu.Unlock()
	if s.refuse.retryAfter != "" {
		w.Header().Set("Retry-After", s.refuse.retryAfter)
	}
	writeError(w, s.refuse.status, "the server is overloaded; try again later")
	return true
}
