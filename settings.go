package caddyfairqueue

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Bounds of the fairness options.
const (
	// maxTenantLen bounds the tenant value that is hashed and compared:
	// the rest of a longer value is ignored, so that a huge header costs
	// no more CPU than this.
	maxTenantLen = 1 << 10
	minWeight    = 0.01
	maxWeight    = 1000
)

// maxAbortGrace bounds AbortGrace: a client that leaves should not
// cost its permit longer than an upstream needs to notice.
const maxAbortGrace = time.Minute

// minDuration is the least value of the durations that have no larger
// least of their own (abort_grace, upstream_cooldown,
// adaptive.target_ttft): a JSON duration given as a bare number is
// nanoseconds, and "abort_grace": 50 meant 50ms is refused, not run.
const minDuration = time.Millisecond

func (h *Handler) setDefaults() {
	h.Name = cmp.Or(h.Name, DefaultName)
	h.MaxWait = cmp.Or(h.MaxWait, caddy.Duration(fairqueue.DefaultMaxWait))
	// A short max wait needs no longer interval than itself.
	h.PollInterval = cmp.Or(h.PollInterval, min(caddy.Duration(fairqueue.DefaultPollInterval), h.MaxWait))
	h.Lease = cmp.Or(h.Lease, caddy.Duration(fairqueue.DefaultLease))
	h.MaxBody = cmp.Or(h.MaxBody, DefaultMaxBody)
	h.BodyTimeout = cmp.Or(h.BodyTimeout, caddy.Duration(DefaultBodyTimeout))
	h.MaxWaitingBytes = cmp.Or(h.MaxWaitingBytes, max(DefaultMaxWaitingBytes, h.MaxBody))
	h.OnStoreError = cmp.Or(h.OnStoreError, FailOpen)
	if takesMax(h.Cost) {
		h.MaxCost = cmp.Or(h.MaxCost, DefaultMaxCost)
	}
	h.PriorityFactor = cmp.Or(h.PriorityFactor, fairqueue.DefaultPriorityFactor)
}

// validate checks the options, with or without setDefaults applied: the
// Caddyfile parser runs it too, to refuse at load what Provision would.
// Errors name the option. The queue's own rules (permits, max_wait,
// poll_interval, lease, priority_factor, max_queue...) are
// fairqueue.Config.Validate's; the rules of the glue's options are here.
func (h *Handler) validate() error {
	if err := checkUpstreams(h.Upstreams, h.KVTokens); err != nil {
		return err
	}
	if err := h.settings().config().Validate(); err != nil {
		return err
	}
	if h.OnStoreError != "" { // "": the default
		if err := checkOnStoreError(h.OnStoreError); err != nil {
			return err
		}
	}
	maxWait := cmp.Or(time.Duration(h.MaxWait), fairqueue.DefaultMaxWait)
	switch {
	case h.MaxWait < 0:
		return fmt.Errorf("max_wait must be positive, got %s", time.Duration(h.MaxWait))
	case h.PollInterval < 0: // 0 is the default; the engine's rule applies to what is set
		return fmt.Errorf("poll_interval must be at least %s, got %s", fairqueue.MinPollInterval, time.Duration(h.PollInterval))
	case h.Lease < 0:
		return fmt.Errorf("lease must be at least %s, got %s", fairqueue.MinLease, time.Duration(h.Lease))
	case h.AbortGrace > 0 && time.Duration(h.AbortGrace) < minDuration: // negative: off
		return fmt.Errorf("abort_grace: want a duration of at least %s or off, got %s", minDuration, time.Duration(h.AbortGrace))
	case checkAbortGrace(h.AbortGrace) != nil:
		return checkAbortGrace(h.AbortGrace)
	case h.MaxBody < 0:
		return fmt.Errorf("max_body must be positive, got %d", h.MaxBody)
	case h.BodyTimeout != 0 && time.Duration(h.BodyTimeout) < minBodyTimeout:
		return fmt.Errorf("body_timeout must be at least %s, got %s", minBodyTimeout, time.Duration(h.BodyTimeout))
	case h.MaxWaitingBytes < 0:
		return fmt.Errorf("max_waiting_bytes must be positive, got %d", h.MaxWaitingBytes)
	case h.MaxWaitingBytes != 0 && h.MaxWaitingBytes < cmp.Or(h.MaxBody, DefaultMaxBody):
		return fmt.Errorf("max_waiting_bytes (%d) must be at least max_body (%d), or a body of max_body could never wait", h.MaxWaitingBytes, cmp.Or(h.MaxBody, DefaultMaxBody))
	case h.LocalPermits < 0:
		return fmt.Errorf("local_permits must be >= 0, got %d", h.LocalPermits)
	case h.LocalPermits > 0 && h.OnStoreError != FailLocal:
		return fmt.Errorf("local_permits requires on_store_error %s", FailLocal)
	case len(h.Weights) > 0 && h.Tenant == "":
		return optErr("weight requires tenant", "weights", "requires tenant")
	case h.WeightPlaceholder != "" && h.Tenant == "":
		return fmt.Errorf("weight_placeholder requires tenant")
	case h.MaxQueuePerTenant != 0 && h.Tenant == "":
		return fmt.Errorf("max_queue_per_tenant requires tenant")
	case h.Cost != "" && !slices.Contains(costModes, h.Cost):
		return checkOneOf("cost", h.Cost, costModes...)
	case h.Cost != "" && !h.fair():
		return fmt.Errorf("cost requires tenant or priority (a FIFO queue has no use for it)")
	case h.MaxCost != 0 && !takesMax(h.Cost):
		return fmt.Errorf("max_cost requires cost %s or %s", CostMaxTokens, CostTokens)
	case h.MaxInFlightPerTenant != 0 && !h.fair():
		return fmt.Errorf("max_in_flight_per_tenant requires tenant or priority (a FIFO queue has no tenants)")
	case h.MaxCost < 0 || h.MaxCost > fairqueue.MaxCost:
		return fmt.Errorf("max_cost must be 1 to %d, got %d", int(fairqueue.MaxCost), h.MaxCost)
	case h.SSEKeepalive != 0 && time.Duration(h.SSEKeepalive) < minSSEKeepalive:
		return fmt.Errorf("sse_keepalive must be at least %s, got %s", minSSEKeepalive, time.Duration(h.SSEKeepalive))
	case time.Duration(h.SSEKeepalive) >= maxWait:
		return fmt.Errorf("sse_keepalive (%s) must be shorter than max_wait (%s), or it never fires", time.Duration(h.SSEKeepalive), maxWait)
	case h.SSEQueueEvents && h.SSEKeepalive == 0:
		return fmt.Errorf("sse_queue_events requires sse_keepalive")
	case h.RejectStream != nil && h.Redis == nil:
		return errRejectStreamNeedsRedis
	case h.Adaptive != nil && h.Adaptive.TargetTTFT > 0 && time.Duration(h.Adaptive.TargetTTFT) < minDuration: // 0: the engine's "required"
		return fmt.Errorf("adaptive: target_ttft must be at least %s, got %s", minDuration, time.Duration(h.Adaptive.TargetTTFT))
	case h.DefaultMaxTokens < 0:
		return fmt.Errorf("default_max_tokens must be at least 1, got %d", h.DefaultMaxTokens)
	case h.DefaultMaxTokens != 0 && !h.countsTokens() && h.Cost != CostTokens:
		return fmt.Errorf("default_max_tokens requires kv_tokens (on the queue or an upstream) or cost %s", CostTokens)
	case h.MediaTokens < 0:
		return fmt.Errorf("media_tokens must be at least 1, got %d", h.MediaTokens)
	case h.MediaTokens != 0 && !h.countsTokens() && h.Cost != CostTokens:
		return fmt.Errorf("media_tokens requires kv_tokens (on the queue or an upstream) or cost %s", CostTokens)
	}
	if err := h.checkPool(); err != nil {
		return err
	}
	if len(h.Names) > 0 {
		if !strings.Contains(h.Name, "{") {
			return errNamesNeedPlaceholders
		}
		if err := checkNames(h.Names); err != nil {
			return err
		}
	}
	if h.RejectStream != nil {
		if err := h.RejectStream.check(); err != nil {
			return inField("reject_stream", err)
		}
	}
	return checkWeights(h.Weights)
}

// checkAbortGrace is the upper bound of abort_grace.
func checkAbortGrace(g caddy.Duration) error {
	if time.Duration(g) > maxAbortGrace {
		return fmt.Errorf("abort_grace must be at most %s, got %s", maxAbortGrace, time.Duration(g))
	}
	return nil
}

// checkOneOf is the rule of an option that takes one of a few values.
func checkOneOf(option, v string, values ...string) error {
	if msg := oneOf(v, values...); msg != "" {
		return errors.New(option + " " + msg)
	}
	return nil
}

// oneOf says what is wrong with v, which is not one of values, or ""
// when it is.
func oneOf(v string, values ...string) string {
	if slices.Contains(values, v) {
		return ""
	}
	last := len(values) - 1
	return fmt.Sprintf("must be %s or %s, got %q", strings.Join(values[:last], ", "), values[last], v)
}

// fair reports whether the queue orders requests fairly across tenants
// (Tenant or Priority is set) rather than in strict FIFO order.
func (h *Handler) fair() bool { return h.Tenant != "" || h.Priority != "" }

// errRejectStreamNeedsRedis: reject_stream writes to the queues' Redis.
var errRejectStreamNeedsRedis = errors.New("reject_stream requires a redis block (the stream is written to the queues' Redis)")

// queueSettings are the settings of one queue that every fair_queue
// handler of one config naming that queue must agree on, as they share
// one engine: the engine's configuration, less what each engine sets for
// itself (perEngine), and the store error policy it derives from.
type queueSettings struct {
	onStoreError string
	cfg          fairqueue.Config
}

func (h *Handler) settings() queueSettings {
	return queueSettings{onStoreError: h.OnStoreError, cfg: fairqueue.Config{
		Permits:              h.Permits,
		MaxWait:              time.Duration(h.MaxWait),
		PollInterval:         time.Duration(h.PollInterval),
		Lease:                time.Duration(h.Lease),
		Fair:                 h.fair(),
		PriorityFactor:       h.PriorityFactor,
		MaxQueue:             h.MaxQueue,
		MaxQueuePerTenant:    h.MaxQueuePerTenant,
		MaxInFlightPerTenant: h.MaxInFlightPerTenant,
		FailOpen:             h.OnStoreError == FailOpen,
		LocalPermits:         h.LocalPermits,
		Upstreams:            h.Upstreams,
		KVTokens:             h.KVTokens,
		Adaptive:             h.Adaptive.engine(),
	}}
}

// diff names the first setting in which s and o differ, with both
// values. Every field of fairqueue.Config counts but those of perEngine,
// so that a new engine setting cannot be left out of the comparison.
func (s queueSettings) diff(o queueSettings) string {
	if s.cfg.Fair != o.cfg.Fair {
		return "fairness (tenant or priority set in one only)"
	}
	if s.onStoreError != o.onStoreError {
		return fmt.Sprintf("on_store_error (%v and %v)", s.onStoreError, o.onStoreError)
	}
	a, b := reflect.ValueOf(s.cfg), reflect.ValueOf(o.cfg)
	for _, f := range reflect.VisibleFields(a.Type()) {
		if !f.IsExported() || f.Anonymous || perEngine[f.Name] || f.Name == "Fair" || f.Name == "FailOpen" {
			continue // not a setting, set per engine, or compared above
		}
		x, y := a.FieldByIndex(f.Index), b.FieldByIndex(f.Index)
		if (x.Kind() == reflect.Slice && x.Len() == 0 && y.Len() == 0) || reflect.DeepEqual(x.Interface(), y.Interface()) {
			continue
		}
		return fmt.Sprintf("%s (%s and %s)", optionName(f.Name), settingValue(x), settingValue(y))
	}
	return ""
}

// settingValue shows a setting in a diff as the operator wrote it: a
// block (a pointer) as the options it sets, by their JSON names, or off
// when unset; a list of blocks (upstreams) as a list of them.
func settingValue(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return "off"
		}
		return settingValue(v.Elem())
	case reflect.Struct:
		var opts []string
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" || v.Field(i).IsZero() {
				continue // not an option, or unset: its default
			}
			opts = append(opts, cmp.Or(name, optionName(f.Name))+": "+settingValue(v.Field(i)))
		}
		return "{" + strings.Join(opts, ", ") + "}"
	case reflect.Slice:
		items := make([]string, v.Len())
		for i := range items {
			items[i] = settingValue(v.Index(i))
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}

// perEngine names the fields of fairqueue.Config that each queue's
// engine sets for itself (see queueConfig and newEngine), which handlers
// need not agree on.
var perEngine = map[string]bool{"Name": true, "Fallback": true, "Logger": true, "Observer": true, "Reserved": true, "ReservedTokens": true}

// optionName is the option of a fairqueue.Config field: MaxWait is
// max_wait, and an initialism is one word (KVTokens is kv_tokens).
func optionName(field string) string {
	var b strings.Builder
	rs := []rune(field)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			// A word starts at an upper-case letter after a lower-case
			// one, or at the last of a run of upper-case letters that a
			// lower-case one follows.
			if i > 0 && (unicode.IsLower(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1])) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// config is the engine configuration of the settings, without what one
// queue's engine adds (perEngine).
func (s queueSettings) config() fairqueue.Config {
	cfg := s.cfg
	if s.onStoreError != FailLocal {
		cfg.LocalPermits = 0
	}
	return cfg
}

// queueConfig is the engine configuration of queue name; fallback is
// the engine's own in-process store for on_store_error local.
func (h *Handler) queueConfig(name string, fallback fairqueue.Store) fairqueue.Config {
	cfg := h.settings().config()
	cfg.Name, cfg.Logger, cfg.Observer = name, h.logger, newObserver(name)
	if h.OnStoreError == FailLocal {
		cfg.Fallback = fallback
	}
	return cfg
}

// defaultMaxTokens is the completion budget of a request whose body sets
// none (DefaultMaxTokens).
func (h *Handler) defaultMaxTokens() int { return cmp.Or(h.DefaultMaxTokens, DefaultMaxTokens) }

// mediaTokens is the prompt tokens a part of a prompt that is not text
// weighs (DefaultMediaTokens).
func (h *Handler) mediaTokens() int { return cmp.Or(h.MediaTokens, DefaultMediaTokens) }

// learnsBudget reports whether a request that sets no completion budget
// is weighed with its queue's learned one: DefaultMaxTokens is not set.
func (h *Handler) learnsBudget() bool { return h.DefaultMaxTokens == 0 }
