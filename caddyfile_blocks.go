package caddyfairqueue

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// parseRedis parses the redis block; see UnmarshalCaddyfile.
func parseRedis(d *caddyfile.Dispenser) (*RedisConfig, error) {
	rc := new(RedisConfig)
	if d.NextArg() {
		rc.URL = d.Val()
		if d.NextArg() {
			return nil, argCountErr(d, "redis", "at most one url")
		}
		if err := checkRedisURL(rc.URL); err != nil {
			return nil, d.Err(err.Error())
		}
	}
	err := parseBlock(d, map[string]optionParser{
		"url": func(d *caddyfile.Dispenser) (err error) {
			if rc.URL != "" {
				return d.Err("redis: url is given twice")
			}
			rc.URL, err = within(stringArg, checkRedisURL)(d)
			return err
		},
		"mode":              checkedOpt(&rc.Mode, checkMode),
		"master_name":       opt(&rc.MasterName, stringArg),
		"sentinel_username": opt(&rc.SentinelUsername, stringArg),
		"sentinel_password": opt(&rc.SentinelPassword, stringArg),
		"address": func(d *caddyfile.Dispenser) error {
			rc.Addresses = d.RemainingArgs()
			if len(rc.Addresses) == 0 {
				return argCountErr(d, "address", "<host:port>...")
			}
			return nil
		},
		"username":      opt(&rc.Username, stringArg),
		"password":      opt(&rc.Password, stringArg),
		"db":            opt(&rc.DB, intArg(0)),
		"tls":           flagOpt(&rc.TLS),
		"key_prefix":    opt(&rc.KeyPrefix, stringArg),
		"dial_timeout":  opt(&rc.DialTimeout, durationArg(minDuration)),
		"read_timeout":  opt(&rc.ReadTimeout, durationArg(minDuration)),
		"write_timeout": opt(&rc.WriteTimeout, durationArg(minDuration)),
	})
	if err != nil {
		return nil, err
	}
	if err := rc.check(); err != nil {
		return nil, d.Err(err.Error())
	}
	return rc, nil
}

// parseReject parses one reject block; see UnmarshalCaddyfile.
func parseReject(d *caddyfile.Dispenser) (*RejectConfig, error) {
	rc := &RejectConfig{Reasons: d.RemainingArgs()}
	for _, r := range rc.Reasons {
		if err := checkReason(r); err != nil {
			return nil, d.Err(err.Error())
		}
	}
	statusOpt := func(dst *int, name string) optionParser {
		return func(d *caddyfile.Dispenser) (err error) {
			if *dst, err = intArg(0)(d); err != nil {
				return err
			}
			if err := checkStatus(name, *dst); err != nil {
				return d.Err(err.Error())
			}
			return nil
		}
	}
	err := parseBlock(d, map[string]optionParser{
		"status":     statusOpt(&rc.Status, "status"),
		"sse_status": statusOpt(&rc.SSEStatus, "sse_status"),
		"retry_after": checkedOpt(&rc.RetryAfter, func(s string) error {
			_, err := parseRetryAfter(s)
			return err
		}),
		"body":      opt(&rc.Body, stringArg),
		"sse_event": opt(&rc.SSEEvent, stringArg),
		"sse_data":  opt(&rc.SSEData, stringArg),
	})
	if err != nil {
		return nil, err
	}
	if rc.Status == 0 && rc.SSEStatus == 0 && rc.RetryAfter == "" && rc.Body == "" && rc.SSEEvent == "" && rc.SSEData == "" {
		return nil, d.Err("reject: a block with at least one option is required")
	}
	return rc, nil
}

// parseRejectStream parses `reject_stream <key> [{ ... }]`; see
// UnmarshalCaddyfile.
func parseRejectStream(d *caddyfile.Dispenser) (*RejectStreamConfig, error) {
	key, err := stringArg(d)
	if err != nil {
		return nil, err
	}
	rs := &RejectStreamConfig{Key: key}
	err = parseBlock(d, map[string]optionParser{
		"maxlen": func(d *caddyfile.Dispenser) error {
			n, err := intArg(1)(d)
			rs.MaxLen = int64(n)
			return err
		},
		"field": pairOpt(&rs.Fields, "reject_stream: field", "<name> <template>", func(d *caddyfile.Dispenser, name, tmpl string) (string, error) {
			if err := checkRejectField(name); err != nil {
				return "", d.Err(err.Error())
			}
			return tmpl, nil
		}),
	}, "field")
	if err != nil {
		return nil, err
	}
	if err := rs.check(); err != nil {
		return nil, d.Err(err.Error())
	}
	return rs, nil
}
