package caddyfairqueue

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("fair_queue", parseCaddyfile)
	// The queue must let a request through before it is proxied. Note
	// that handle, route and respond still come first: put fair_queue in
	// the same block as reverse_proxy.
	httpcaddyfile.RegisterDirectiveOrder("fair_queue", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	fq := new(Handler)
	if err := fq.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return fq, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	fair_queue [<matcher>] {
//	    name          <queue name>         # default "default"; placeholders allowed, e.g. {http.fair_queue.model}
//	    permits       <n>                  # required, > 0, cluster-wide
//	    max_wait      <duration>           # default 20s
//	    poll_interval <duration>           # default 200ms; at least 50ms, at most max_wait
//	    max_body      <size>               # default 8MiB (e.g. 1MiB, 512KB); larger bodies get 413
//	    lease         <duration>           # default 30s; at least 1s
//
//	    redis [<url>] {
//	        url           redis://[user:pass@]host:port/db   # or rediss://, unix://
//	        address       <host:port>...   # instead of url; several = Redis Cluster
//	        username      <username>
//	        password      <password>       # e.g. {env.REDIS_PASSWORD}
//	        db            <n>
//	        tls
//	        key_prefix    <prefix>         # default "fair_queue"
//	        dial_timeout  <duration>       # default 500ms
//	        read_timeout  <duration>       # default 500ms
//	        write_timeout <duration>       # default 500ms
//	    }
//
//	    on_store_error fail_open|fail_closed   # default fail_open
//
//	    # no reason: defaults for every reason; repeat per reason
//	    reject [timeout|queue_full|shutting_down|store_unavailable...] {
//	        status      <code>             # default 429 (timeout, queue_full), 503 (shutting_down, store_unavailable)
//	        retry_after <duration>|auto    # default auto
//	        body        <template>         # default: {"error":{"message":...,"type":...,"code":<reason>}}
//	        sse_status  <code>             # streaming requests; default 200
//	        sse_event   <name>             # default "error"
//	        sse_data    <template>         # default: body, or the default error object
//	    }
//	}
//
// Every option may be given once, except reject. Templates may span
// lines with a heredoc (<<JSON ... JSON).
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	err := parseBlock(d, map[string]func(*caddyfile.Dispenser) error{
		"name": func(d *caddyfile.Dispenser) (err error) {
			h.Name, err = stringArg(d)
			return err
		},
		"permits": func(d *caddyfile.Dispenser) (err error) {
			h.Permits, err = intArg(d, 1)
			return err
		},
		"max_wait": func(d *caddyfile.Dispenser) (err error) {
			h.MaxWait, err = durationArg(d, time.Nanosecond)
			return err
		},
		"poll_interval": func(d *caddyfile.Dispenser) (err error) {
			h.PollInterval, err = durationArg(d, fairqueue.MinPollInterval)
			return err
		},
		"lease": func(d *caddyfile.Dispenser) (err error) {
			h.Lease, err = durationArg(d, fairqueue.MinLease)
			return err
		},
		"max_body": func(d *caddyfile.Dispenser) (err error) {
			h.MaxBody, err = sizeArg(d)
			return err
		},
		"on_store_error": func(d *caddyfile.Dispenser) (err error) {
			if h.OnStoreError, err = stringArg(d); err != nil {
				return err
			}
			if h.OnStoreError != FailOpen && h.OnStoreError != FailClosed {
				return d.Errf("on_store_error must be %s or %s, got '%s'", FailOpen, FailClosed, h.OnStoreError)
			}
			return nil
		},
		"redis": func(d *caddyfile.Dispenser) (err error) {
			h.Redis, err = parseRedis(d)
			return err
		},
		"reject": func(d *caddyfile.Dispenser) error {
			rc, err := parseReject(d)
			if err != nil {
				return err
			}
			h.Reject = append(h.Reject, rc)
			if _, err := compileRejects(h.Reject); err != nil {
				return d.Err(err.Error())
			}
			return nil
		},
	}, "reject")
	if err != nil {
		return err
	}
	maxWait := cmp.Or(time.Duration(h.MaxWait), fairqueue.DefaultMaxWait)
	switch {
	case h.Permits == 0:
		return d.Err("permits is required")
	case time.Duration(h.PollInterval) > maxWait:
		return d.Errf("poll_interval (%s) must not exceed max_wait (%s)", time.Duration(h.PollInterval), maxWait)
	}
	return nil
}

func parseRedis(d *caddyfile.Dispenser) (*RedisConfig, error) {
	rc := new(RedisConfig)
	if d.NextArg() {
		rc.URL = d.Val()
		if d.NextArg() {
			return nil, d.ArgErr()
		}
	}
	err := parseBlock(d, map[string]func(*caddyfile.Dispenser) error{
		"url": func(d *caddyfile.Dispenser) (err error) {
			if rc.URL != "" {
				return d.Err("redis: url is given twice")
			}
			rc.URL, err = stringArg(d)
			return err
		},
		"address": func(d *caddyfile.Dispenser) error {
			rc.Addresses = d.RemainingArgs()
			if len(rc.Addresses) == 0 {
				return d.ArgErr()
			}
			return nil
		},
		"username": func(d *caddyfile.Dispenser) (err error) {
			rc.Username, err = stringArg(d)
			return err
		},
		"password": func(d *caddyfile.Dispenser) (err error) {
			rc.Password, err = stringArg(d)
			return err
		},
		"db": func(d *caddyfile.Dispenser) (err error) {
			rc.DB, err = intArg(d, 0)
			return err
		},
		"tls": func(d *caddyfile.Dispenser) error {
			if d.NextArg() {
				return d.ArgErr()
			}
			rc.TLS = true
			return nil
		},
		"key_prefix": func(d *caddyfile.Dispenser) (err error) {
			rc.KeyPrefix, err = stringArg(d)
			return err
		},
		"dial_timeout": func(d *caddyfile.Dispenser) (err error) {
			rc.DialTimeout, err = durationArg(d, time.Nanosecond)
			return err
		},
		"read_timeout": func(d *caddyfile.Dispenser) (err error) {
			rc.ReadTimeout, err = durationArg(d, time.Nanosecond)
			return err
		},
		"write_timeout": func(d *caddyfile.Dispenser) (err error) {
			rc.WriteTimeout, err = durationArg(d, time.Nanosecond)
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	if rc.URL != "" && len(rc.Addresses) > 0 {
		return nil, d.Err("redis: url and address are mutually exclusive")
	}
	// A URL with placeholders is checked at load time, once replaced.
	if rc.URL != "" && !strings.Contains(rc.URL, "{") {
		if _, err := parseRedisURL(rc.URL); err != nil {
			return nil, d.Err(err.Error())
		}
	}
	if len(rc.Addresses) > 1 && rc.DB != 0 {
		return nil, d.Errf("redis: db must be 0 with a Redis Cluster (several addresses), got %d", rc.DB)
	}
	return rc, nil
}

func parseReject(d *caddyfile.Dispenser) (*RejectConfig, error) {
	rc := &RejectConfig{Reasons: d.RemainingArgs()}
	for _, r := range rc.Reasons {
		if !validReason(r) {
			return nil, d.Errf("reject: unknown reason '%s' (want timeout, queue_full, shutting_down or store_unavailable)", r)
		}
	}
	statusOpt := func(dst *int, name string) func(*caddyfile.Dispenser) error {
		return func(d *caddyfile.Dispenser) (err error) {
			if *dst, err = intArg(d, 0); err != nil {
				return err
			}
			if !validStatus(*dst) {
				return d.Errf("reject: %s must be 200-599, got %d", name, *dst)
			}
			return nil
		}
	}
	stringOpt := func(dst *string) func(*caddyfile.Dispenser) error {
		return func(d *caddyfile.Dispenser) (err error) {
			*dst, err = stringArg(d)
			return err
		}
	}
	err := parseBlock(d, map[string]func(*caddyfile.Dispenser) error{
		"status":     statusOpt(&rc.Status, "status"),
		"sse_status": statusOpt(&rc.SSEStatus, "sse_status"),
		"retry_after": func(d *caddyfile.Dispenser) (err error) {
			if rc.RetryAfter, err = stringArg(d); err != nil {
				return err
			}
			if _, err := parseRetryAfter(rc.RetryAfter); err != nil {
				return d.Err(err.Error())
			}
			return nil
		},
		"body":      stringOpt(&rc.Body),
		"sse_event": stringOpt(&rc.SSEEvent),
		"sse_data":  stringOpt(&rc.SSEData),
	})
	if err != nil {
		return nil, err
	}
	if rc.Status == 0 && rc.SSEStatus == 0 && rc.RetryAfter == "" && rc.Body == "" && rc.SSEEvent == "" && rc.SSEData == "" {
		return nil, d.Err("reject: a block with at least one option is required")
	}
	return rc, nil
}

// parseBlock parses the block that follows the current token, calling
// the parser of each option; an unknown option, or one given twice that
// is not repeatable, is an error.
func parseBlock(d *caddyfile.Dispenser, opts map[string]func(*caddyfile.Dispenser) error, repeatable ...string) error {
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		parse, ok := opts[opt]
		if !ok {
			return d.Errf("unrecognized subdirective '%s'", opt)
		}
		if seen[opt] && !slices.Contains(repeatable, opt) {
			return d.Errf("subdirective '%s' is given twice", opt)
		}
		seen[opt] = true
		if err := parse(d); err != nil {
			return err
		}
	}
	return nil
}

// stringArg reads exactly one argument.
func stringArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

// intArg reads one integer argument of at least minimum.
func intArg(d *caddyfile.Dispenser, minimum int) (int, error) {
	opt := d.Val()
	v, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s: '%s' is not an integer", opt, v)
	}
	if n < minimum {
		return 0, d.Errf("%s must be at least %d, got %d", opt, minimum, n)
	}
	return n, nil
}

// durationArg reads one duration argument of at least minimum.
func durationArg(d *caddyfile.Dispenser, minimum time.Duration) (caddy.Duration, error) {
	opt := d.Val()
	v, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%s: invalid duration '%s'", opt, v)
	}
	if dur < minimum {
		if minimum == time.Nanosecond {
			return 0, d.Errf("%s must be positive, got %s", opt, v)
		}
		return 0, d.Errf("%s must be at least %s, got %s", opt, minimum, v)
	}
	return caddy.Duration(dur), nil
}

// sizeArg reads one positive size argument such as 8MiB or 512KB.
func sizeArg(d *caddyfile.Dispenser) (int64, error) {
	opt := d.Val()
	v, err := stringArg(d)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n > math.MaxInt64 {
		return 0, d.Errf("%s: invalid size '%s'", opt, v)
	}
	if n == 0 {
		return 0, d.Errf("%s must be positive, got %s", opt, v)
	}
	return int64(n), nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
