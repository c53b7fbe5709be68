package caddyfairqueue

import (
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The Caddyfile syntax of the options that pick what a handler serves
// and where: names, a pool's upstream lines and their requeues, and
// reverse_proxy's `dynamic fair_queue`.

// parseNames parses `names <name>...`, which may be repeated.
func (h *Handler) parseNames(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return argCountErr(d, "names", "<name>...")
	}
	h.Names = append(h.Names, args...)
	if err := checkNames(h.Names); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// parseUpstream parses `upstream <dial address> <permits> [kv_tokens <n>]`.
func (h *Handler) parseUpstream(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) != 2 && len(args) != 4 {
		return argCountErr(d, "upstream", "<dial address> <permits> [kv_tokens <n>]")
	}
	tokens := 0
	if len(args) == 4 {
		if args[2] != "kv_tokens" {
			return d.Errf("upstream %s: unknown option '%s' (want kv_tokens)", args[0], args[2])
		}
		var err error
		if tokens, err = strconv.Atoi(args[3]); err != nil {
			return d.Errf("upstream %s: kv_tokens '%s' is not an integer", args[0], args[3])
		}
		if tokens < 1 {
			return d.Errf("upstream %s: kv_tokens must be at least 1, got %d", args[0], tokens)
		}
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return d.Errf("upstream %s: permits '%s' is not an integer", args[0], args[1])
	}
	if n < 1 {
		return d.Errf("upstream %s: permits must be at least 1, got %d", args[0], n)
	}
	if strings.ContainsAny(args[0], " \t\r\n|") {
		return d.Errf("upstream %q: the dial address must not contain spaces or '|'", args[0])
	}
	if err := checkDial(args[0]); err != nil {
		return d.Errf("upstream %s: %v", args[0], err)
	}
	if slices.ContainsFunc(h.Upstreams, func(u fairqueue.Upstream) bool { return u.Dial == args[0] }) {
		return d.Errf("upstream %s is given twice", args[0])
	}
	h.Upstreams = append(h.Upstreams, fairqueue.Upstream{Dial: args[0], Permits: n, KVTokens: tokens})
	return nil
}

// parseRequeueOn parses `requeue_on <status>...`.
func (h *Handler) parseRequeueOn(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return argCountErr(d, "requeue_on", "<status>...")
	}
	for _, a := range args {
		s, err := strconv.Atoi(a)
		if err != nil {
			return d.Errf("requeue_on: '%s' is not a status code", a)
		}
		if err := checkRequeueStatus(s); err != nil {
			return d.Err(err.Error())
		}
		h.RequeueOn = append(h.RequeueOn, s)
	}
	return nil
}

// parseMaxRequeues parses `max_requeues <n>`.
func (h *Handler) parseMaxRequeues(d *caddyfile.Dispenser) error {
	n, err := within(intArg(0), checkMaxRequeues)(d)
	if err != nil {
		return err
	}
	h.MaxRequeues = &n
	return nil
}

// UnmarshalCaddyfile sets up the source from `dynamic fair_queue`, which
// takes no options.
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the source's name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(d.Nesting()) {
		return d.Errf("unrecognized subdirective '%s' (dynamic fair_queue takes no options)", d.Val())
	}
	return nil
}
