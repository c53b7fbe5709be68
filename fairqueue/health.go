package fairqueue

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

var errStoreDown = errors.New("store marked down after consecutive failures")

// health is the store's up/down state: down after downAfter consecutive
// failed calls, up again after one success. One failure does not flip it.
type health struct {
	onFail func(error)
	// onDown runs as the store is marked down, before any caller sees it
	// down (Queue.storeDown); mu orders the marks.
	onDown func()
	// onMarkedDown runs once the store reads down (Queue: it wakes the
	// loop, which probes the store at least once a second while down).
	onMarkedDown func()
	// needs is what the store's user needs to be granted
	// (PermissionNeeder), for the log line of a store that refuses it.
	needs string
	// mark is the down mark, nil while the store is up: one word, so
	// that a success that clears a mark clears its refusal with it, and
	// a refusal shows only while the store is down.
	mark      atomic.Pointer[downMark]
	mu        sync.Mutex
	downAfter atomic.Int32
	fails     atomic.Int32
}

// downMark is the store marked down.
type downMark struct {
	// refusal is the refusal (Refused) that marked the store down, and
	// what the user needs; "" where the store failed otherwise.
	refusal string
}

func (h *health) up() bool { return h.mark.Load() == nil }

// refusedBy is the refusal that marked the store down, while it is
// down; "" otherwise.
func (h *health) refusedBy() string {
	_, refusal := h.state()
	return refusal
}

// state is up and refusedBy read at once.
func (h *health) state() (up bool, refusal string) {
	if m := h.mark.Load(); m != nil {
		return false, m.refusal
	}
	return true, ""
}

// markedDown reports whether the store is marked down, once a mark on
// its way has run its onDown: a ticket queued (Queue.missedMove) before
// a mark that starts after this returns false is one that mark's onDown
// finds queued.
func (h *health) markedDown() bool {
	if !h.up() {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.up()
}

// unreachable reports whether err is a failed dial of the store.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Refused reports whether err is the store refusing its user a
// permission: Redis's NOPERM, from an ACL that does not grant the
// queue's keys, channels or commands. The store answers: not an outage,
// but a grant missing, which every call meets until it is made. Only an
// answer of Redis's (go-redis's errors of a reply have RedisError) is
// read: a queue's name, in the text of every error of its store, may
// say NOPERM too.
func Refused(err error) bool {
	var reply interface {
		error
		RedisError()
	}
	return errors.As(err, &reply) && strings.Contains(reply.Error(), "NOPERM")
}

// PermissionNeeder is a Store that says what its user must be granted
// (a Redis ACL): the log line of a store that refuses its user a
// permission gives it.
type PermissionNeeder interface {
	PermissionsNeeded() string
}

// permissionsNeeded is what store's user needs (PermissionNeeder), or "".
func permissionsNeeded(store Store) string {
	if pn, ok := store.(PermissionNeeder); ok {
		return pn.PermissionsNeeded()
	}
	return ""
}

func (h *health) record(log *zap.Logger, err error) {
	if err == nil {
		h.ok(log)
	} else if !errors.Is(err, errClosed) && !errors.Is(err, ErrStoreBusy) {
		h.failed(log, err)
	}
}

// ok records a call the store answered: up again, and its refusal, if
// it was one, gone with the mark (a mark that lands meanwhile is
// cleared whole, as if it came first).
func (h *health) ok(log *zap.Logger) {
	h.fails.Store(0)
	if h.mark.Load() != nil && h.mark.Swap(nil) != nil {
		log.Info("store reachable again")
	}
}

func (h *health) failed(log *zap.Logger, err error) {
	if h.onFail != nil {
		h.onFail(err)
	}
	if h.fails.Add(1) >= h.downAfter.Load() {
		h.markDown(log, err)
	}
}

// outage marks the store down now when err says it cannot be reached
// (a dial that failed: refused, no route, no such host): a request was
// answered by the on_store_error policy, and every next one would be.
// A slow store (a call that timed out) is left to record's count of
// consecutive failures: one late answer does not send the node's every
// request to the policy. Up again after one success, as always.
func (h *health) outage(log *zap.Logger, err error) {
	if !unreachable(err) {
		return
	}
	h.markDown(log, err)
}

// whileDown runs f if the store is marked down, ordered with the marks:
// a mark on its way runs onDown after f's caller changed what it reads,
// and one done already does not run it again.
func (h *health) whileDown(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.up() {
		f()
	}
}

// markDown marks the store down, unless it is already, once onDown has
// run: a request that finds the store down finds what onDown did too.
func (h *health) markDown(log *zap.Logger, err error) {
	if !h.up() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.up() {
		return
	}
	if h.onDown != nil {
		h.onDown()
	}
	if Refused(err) {
		refusal := err.Error()
		fields := []zap.Field{zap.Error(err)}
		if h.needs != "" {
			fields = append(fields, zap.String("needs", "ACL SETUSER <user> "+h.needs))
			refusal += "; the user needs: ACL SETUSER <user> " + h.needs
		}
		h.mark.Store(&downMark{refusal: refusal})
		log.Error("store refused this user a permission (NOPERM: its ACL lacks a key, channel or command the queue needs); "+
			"applying on_store_error policy until it is granted", fields...)
	} else {
		h.mark.Store(&downMark{})
		log.Error("store unreachable; applying on_store_error policy", zap.Error(err))
	}
	if h.onMarkedDown != nil {
		h.onMarkedDown()
	}
}
