package caddyfairqueue

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// claims records, per config load, the settings of every queue a handler
// names statically, to refuse a config whose handlers disagree on one
// queue. A config load is identified by its context's Done channel, which
// every module provisioned from it shares.
var claims = struct {
	sync.Mutex
	m map[claimKey]*claim
	// named counts, per config load and queue, the handlers that name
	// the queue, in any store (soleClaimant).
	named map[namedKey]*claimants
	// fromReq lists, per config load, its handlers that name their
	// queue from the request (soleClaimant).
	fromReq map[<-chan struct{}]*fromRequest
}{m: make(map[claimKey]*claim), named: make(map[namedKey]*claimants), fromReq: make(map[<-chan struct{}]*fromRequest)}

// fromRequest are the handlers of a config load that name their queue
// from the request, as provisioned (a cleanup drops none: a handler
// cleaned up tells what its config had). Under claims' lock.
type fromRequest struct{ hs []*Handler }

// namedKey is a queue of a config load, in any store.
type namedKey struct {
	load  <-chan struct{}
	queue string
}

// claimants are the handlers of a config load that name a queue: n
// provisioned, which their cleanups do not lower (a handler cleaned up
// tells what its config had), left not cleaned up yet.
type claimants struct{ n, left int }

type claimKey struct {
	load  <-chan struct{}
	queue string // backend.queueKey: the data set and the queue in it
}

type claim struct {
	settings queueSettings
	refs     int
	server   string // where the first handler is: its server's listen addresses
}

// addClaim registers the handler's settings for its queue in the config
// load of ctx, or reports how they differ from another handler's.
func (h *Handler) addClaim(ctx caddy.Context) error {
	load := ctx.Done()
	if load == nil {
		return nil
	}
	k := claimKey{load: load, queue: h.backend.queueKey(h.Name)}
	s := h.settings()
	server := serverOf(ctx)
	claims.Lock()
	defer claims.Unlock()
	if c := claims.m[k]; c != nil {
		if d := c.settings.diff(s); d != "" {
			// A handler without name is the queue "default": say so,
			// as the operator may have named no queue at all.
			unnamed := ""
			if h.Name == DefaultName {
				unnamed = " (the queue of every fair_queue without a name)"
			}
			return fmt.Errorf("queue %q%s is configured by two fair_queue handlers with different %s%s; "+
				"handlers naming one queue must agree; to keep their queues apart, give each its own name",
				h.Name, unnamed, d, sites(c.server, server))
		}
		c.refs++
	} else {
		claims.m[k] = &claim{settings: s, refs: 1, server: server}
	}
	h.claim = &k
	nk := namedKey{load, h.Name}
	if claims.named[nk] == nil {
		claims.named[nk] = &claimants{}
	}
	h.claimants = claims.named[nk]
	h.claimants.n++
	h.claimants.left++
	return nil
}

// serverOf names the server of ctx's handler by its listen addresses,
// as the Caddyfile's site addresses give them; "" outside a server.
func serverOf(ctx caddy.Context) string {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil || len(srv.Listen) == 0 {
		return ""
	}
	return strings.Join(srv.Listen, " ")
}

// sites says where two handlers that disagree on a queue are (the
// servers first and other), or "" when either is unknown.
func sites(first, other string) string {
	switch {
	case first == "" || other == "":
		return ""
	case first == other:
		return ": both in the server on " + first
	}
	return ": the first in the server on " + first + ", the other in the server on " + other
}

func (h *Handler) dropClaim() {
	if h.claim == nil {
		return
	}
	claims.Lock()
	defer claims.Unlock()
	if c := claims.m[*h.claim]; c != nil {
		if c.refs--; c.refs <= 0 {
			delete(claims.m, *h.claim)
		}
	}
	if h.claimants.left--; h.claimants.left <= 0 {
		delete(claims.named, namedKey{h.claim.load, h.Name}) // as addClaim keyed it
	}
	h.claim = nil
}

// soleClaimant reports whether the handler is the only one of its config
// that may serve its queue: the only one that names it (statically, in
// any store; one that names it from the request claims none), and no
// handler of its config names queues from the request that may name it
// too (one without names, or whose names list it), also after its
// cleanup and its other handlers'.
func (h *Handler) soleClaimant() bool {
	claims.Lock()
	defer claims.Unlock()
	if h.claimants == nil || h.claimants.n != 1 {
		return false
	}
	if h.fromReq != nil {
		for _, x := range h.fromReq.hs {
			if x.serves(h.Name) {
				return false
			}
		}
	}
	return true
}

// joinLoad shares the list of its config load's handlers that name their
// queue from the request with h, and adds h to it if h is one. The list
// goes from claims when the load's context ends; its handlers keep it.
func (h *Handler) joinLoad(ctx caddy.Context) {
	if h.load == nil {
		return
	}
	claims.Lock()
	defer claims.Unlock()
	f := claims.fromReq[h.load]
	if f == nil {
		f = &fromRequest{}
		claims.fromReq[h.load] = f
		load := h.load
		context.AfterFunc(ctx, func() {
			claims.Lock()
			defer claims.Unlock()
			delete(claims.fromReq, load)
		})
	}
	h.fromReq = f
	if h.dynamic {
		f.hs = append(f.hs, h)
	}
}
