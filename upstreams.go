package caddyfairqueue

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	caddy.RegisterModule(Upstreams{})
}

// Bounds and defaults of the pool options (Handler.Upstreams).
const (
	// DefaultMaxRequeues is how often one request is sent back into the
	// queue when Handler.MaxRequeues is not set.
	DefaultMaxRequeues = 3
	maxMaxRequeues     = 100
)

// varUpstream is the caddyhttp variable that carries the granted
// upstream's dial address from fair_queue to reverse_proxy's dynamic
// upstream source (Upstreams).
const varUpstream = "fair_queue.upstream"

// checkPool is the rule of the pool options (the one home of their
// messages; the Caddyfile parser reports them with the line).
func (h *Handler) checkPool() error {
	if len(h.Upstreams) == 0 {
		switch {
		case len(h.RequeueOn) > 0:
			return optErr("requeue_on requires upstream (a pool to requeue into)", "requeue_on", "requires upstreams (a pool to requeue into)")
		case h.MaxRequeues != nil:
			return optErr("max_requeues requires upstream", "max_requeues", "requires upstreams")
		case h.UpstreamCooldown != 0:
			return optErr("upstream_cooldown requires upstream", "upstream_cooldown", "requires upstreams")
		}
		return nil
	}
	if strings.Contains(h.Name, "{") {
		// Each name would open a queue of its own, each counting the
		// upstreams' permits apart: together they would over-admit them.
		msg := fmt.Sprintf("requires a fixed name, got %q (a placeholder opens one queue per value, and each would count the upstreams' permits on its own)", h.Name)
		return optErr("upstream "+msg, "upstreams", msg)
	}
	for i, s := range h.RequeueOn {
		if err := checkRequeueStatus(s); err != nil {
			return inField("requeue_on["+strconv.Itoa(i)+"]", err)
		}
	}
	if n := h.MaxRequeues; n != nil {
		if err := checkMaxRequeues(*n); err != nil {
			return err
		}
	}
	if err := checkCooldown(h.UpstreamCooldown); err != nil {
		return err
	}
	sum, tokens, withTokens := 0, 0, 0
	for _, u := range h.Upstreams { // each checked by checkUpstreams
		sum += u.Permits
		if u.KVTokens > 0 {
			tokens += u.KVTokens
			withTokens++
		}
	}
	if h.Permits > sum {
		return fmt.Errorf("permits (%d) is more than the upstreams' permits together (%d): it caps the pool, leave it out to use their sum", h.Permits, sum)
	}
	// kv_tokens on only some upstreams is checkUpstreams's rule (and
	// fairqueue.Config.Validate's). This one is the glue's: the engine's
	// local fallback scales the queue's and each upstream's tokens apart,
	// and may round into it.
	if withTokens == len(h.Upstreams) && h.KVTokens > tokens {
		return fmt.Errorf("kv_tokens (%d) is more than the upstreams' kv_tokens together (%d): it caps the pool, leave it out to use their sum", h.KVTokens, tokens)
	}
	return nil
}

// checkUpstreams is the rule of each upstream line (JSON: each entry of
// upstreams) and of kv_tokens set on some only, kvTokens the queue's
// own; the engine's Config.Validate would name them in its own words.
func checkUpstreams(us []fairqueue.Upstream, kvTokens int) error {
	withTokens, without := 0, -1
	for i, u := range us {
		at := "upstreams[" + strconv.Itoa(i) + "]"
		var field, msg string
		dialErr := checkDial(u.Dial)
		switch {
		case u.Dial == "":
			field, msg = "dial", "the address is empty"
		case strings.ContainsAny(u.Dial, " \t\r\n|"):
			field, msg = "dial", "the address must not contain spaces or '|'"
		case dialErr != nil:
			field, msg = "dial", fmt.Sprintf("%q: %v", u.Dial, dialErr)
		case slices.ContainsFunc(us[:i], func(o fairqueue.Upstream) bool { return o.Dial == u.Dial }):
			return optErr(fmt.Sprintf("upstream %s is given twice", u.Dial), at+".dial", u.Dial+" is listed twice")
		case u.Permits < 1:
			field, msg = "permits", fmt.Sprintf("must be at least 1, got %d", u.Permits)
		case u.KVTokens < 0:
			field, msg = "kv_tokens", fmt.Sprintf("must be >= 0, got %d", u.KVTokens)
		}
		if msg != "" {
			caddyfile := fmt.Sprintf("upstream %s: %s %s", u.Dial, field, msg)
			if field == "dial" {
				caddyfile = "upstream " + msg
			}
			return optErr(caddyfile, at+"."+field, msg)
		}
		if u.KVTokens > 0 {
			withTokens++
		} else if without < 0 {
			without = i
		}
	}
	if kvTokens == 0 && withTokens > 0 && without >= 0 {
		msg := fmt.Sprintf("is set on %d of the %d upstreams, not on this one (%s): set it on every upstream, or kv_tokens on the queue too",
			withTokens, len(us), us[without].Dial)
		return optErr(fmt.Sprintf("kv_tokens is set on %d of the %d upstreams, not on upstream %s: set it on every upstream, or kv_tokens on the queue too",
			withTokens, len(us), us[without].Dial), "upstreams["+strconv.Itoa(without)+"].kv_tokens", msg)
	}
	return nil
}

// checkDial reports an upstream address that reverse_proxy could not
// dial (every request granted on it would answer 502): a URL, a host
// without a port, a port that is not a number, a port range. One with a
// placeholder is known only when reverse_proxy replaces it.
func checkDial(dial string) error {
	if strings.Contains(dial, "{") {
		return nil
	}
	if strings.Contains(dial, "://") {
		return errors.New("the address is dialed, not a URL: give host:port")
	}
	addr, err := caddy.ParseNetworkAddress(dial)
	switch {
	case err != nil:
		return fmt.Errorf("not a dial address: %w", err)
	case addr.IsUnixNetwork() || addr.IsFdNetwork():
		return nil
	case addr.StartPort == 0:
		return errors.New("the address needs a port: give host:port")
	case addr.PortRangeSize() != 1:
		return errors.New("the address must have one port, not a range")
	}
	return nil
}

// countsTokens reports whether the queue counts KV-cache tokens: kv_tokens
// is set on it or on an upstream of its pool.
func (h *Handler) countsTokens() bool {
	return h.KVTokens > 0 || slices.ContainsFunc(h.Upstreams, func(u fairqueue.Upstream) bool { return u.KVTokens > 0 })
}

// checkMaxRequeues is the rule of max_requeues.
func checkMaxRequeues(n int) error {
	if n < 0 || n > maxMaxRequeues {
		return fmt.Errorf("max_requeues must be 0 to %d, got %d", maxMaxRequeues, n)
	}
	return nil
}

// checkCooldown is the rule of upstream_cooldown (0: the default).
func checkCooldown(c caddy.Duration) error {
	if d := time.Duration(c); d < 0 || d > fairqueue.MaxCooldown {
		return fmt.Errorf("upstream_cooldown must be positive and at most %s, got %s", fairqueue.MaxCooldown, d)
	} else if d > 0 && d < minDuration {
		return fmt.Errorf("upstream_cooldown must be at least %s, got %s", minDuration, d)
	}
	return nil
}

// checkRequeueStatus is the rule of one requeue_on status.
func checkRequeueStatus(s int) error {
	if s < 400 || s > 599 {
		msg := fmt.Sprintf("must be 400 to 599, got %d", s)
		return optErr("requeue_on: status "+msg, "", msg)
	}
	return nil
}

// maxRequeues is the number of requeues a request may take.
func (h *Handler) maxRequeues() int {
	if h.MaxRequeues == nil {
		return DefaultMaxRequeues
	}
	return *h.MaxRequeues
}

// upstreamCooldown is the cooldown of an upstream that failed a request
// and said nothing of its own (no Retry-After).
func (h *Handler) upstreamCooldown() time.Duration {
	return cmp.Or(time.Duration(h.UpstreamCooldown), fairqueue.DefaultCooldown)
}

// Upstreams is reverse_proxy's dynamic upstream source for a queue with
// a pool (fair_queue's upstream lines): it returns the one upstream the
// request's permit was granted on, so that the request runs where the
// queue counted it. In the Caddyfile:
//
//	reverse_proxy {
//	    dynamic fair_queue
//	}
//
// The fair_queue handler must run before reverse_proxy in the same
// route. A request that reaches it without a grant (no fair_queue before
// it, or one without upstream lines) is an error that names fair_queue;
// reverse_proxy logs it and, without static upstreams, answers 503.
type Upstreams struct{}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.fair_queue",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

// errNoGrant: a request reached reverse_proxy's dynamic fair_queue
// without a grant from a fair_queue handler with a pool.
var errNoGrant = errors.New("dynamic fair_queue: the request holds no upstream grant; put a fair_queue handler with upstream lines before this reverse_proxy")

// GetUpstreams implements reverseproxy.UpstreamSource.
func (Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	dial, _ := caddyhttp.GetVar(r.Context(), varUpstream).(string)
	if dial == "" {
		return nil, errNoGrant
	}
	return []*reverseproxy.Upstream{{Dial: dial}}, nil
}

// grantUpstream tells reverse_proxy (Upstreams) and the placeholder
// {http.fair_queue.upstream} where the request goes.
func grantUpstream(r *http.Request, repl *caddy.Replacer, dial string) {
	caddyhttp.SetVar(r.Context(), varUpstream, dial)
	repl.Set(phUpstream, dial)
}

// Interface guards
var (
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler       = (*Upstreams)(nil)
)
