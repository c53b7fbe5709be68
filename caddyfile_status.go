package caddyfairqueue

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("fair_queue_status", parseStatusPage)
	// A terminal, read-only view of the instance, as metrics is.
	httpcaddyfile.RegisterDirectiveOrder("fair_queue_status", httpcaddyfile.After, "metrics")
}

func parseStatusPage(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	p := new(StatusPage)
	if err := p.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return p, nil
}

// UnmarshalCaddyfile sets up the page from Caddyfile tokens. Syntax:
//
//	fair_queue_status [<matcher>]
//
// It takes no arguments and no block.
func (p *StatusPage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("unrecognized subdirective '%s'", d.Val())
	}
	return nil
}
