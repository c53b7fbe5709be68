package caddyfairqueue

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// A request's outcome, as logs, the access log, placeholders and
// metrics show it.

// record publishes the request's outcome (see Handler.record).
func (c *call) record(outcome, reason string, waited time.Duration, position int) {
	c.h.record(c.r, c.repl, c.name, outcome, reason, waited, position)
}

// record publishes a request's outcome: placeholders, access log fields,
// metrics and a debug log.
func (h *Handler) record(r *http.Request, repl *caddy.Replacer, name, outcome, reason string, waited time.Duration, position int) {
	waitMS := waited.Milliseconds()
	repl.Set(phOutcome, outcome)
	repl.Set(phReason, reason)
	repl.Set(phWaitMS, waitMS)
	repl.Set(phPosition, position)
	fields := []zap.Field{
		zap.String("queue", name),
		zap.String("outcome", outcome),
		zap.String("reason", reason),
		zap.Int64("wait_ms", waitMS),
		zap.Int("position", position),
	}
	if tenant, _ := repl.GetString(phTenant); tenant != "" { // a hash, set with Tenant only
		fields = append(fields, zap.String("tenant", tenant))
	}
	if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Set(zap.Object("fair_queue", accessLogObject{fields: fields, repl: repl}))
	}
	observe(name, outcome, waited)
	if c := h.logger.Check(zapcore.DebugLevel, "fair queue"); c != nil {
		c.Write(fields...)
	}
}

// accessLogObject is the access log's fair_queue object: the outcome's
// fields, and with a pool the upstream the request last went to, read
// when the access log is written, as a requeue may move it after the
// outcome is recorded.
type accessLogObject struct {
	fields []zap.Field
	repl   *caddy.Replacer
}

// MarshalLogObject implements zapcore.ObjectMarshaler.
func (o accessLogObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, f := range o.fields {
		f.AddTo(enc)
	}
	if up, _ := o.repl.GetString(phUpstream); up != "" {
		enc.AddString("upstream", up)
	}
	return nil
}
