package caddyfairqueue

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// RejectStreamConfig records every reject of the handler in a Redis
// stream (XADD), so that an application can act on it: write the
// "the system is busy" answer into the conversation the request belonged
// to, alert, or count. The handler never waits for Redis: records are
// written in the background, and a record that cannot be written within
// a second, or finds 1024 others waiting, is dropped and counted in a
// Warn log (at most one a minute).
//
// Each entry has these fields, then the configured Fields:
//
//	reason    timeout, queue_full, shutting_down or store_unavailable
//	queue     the queue name ("(overflow)" for a name the handler could not open)
//	wait_ms   how long the request waited, in milliseconds
//	position  its last known place in the queue (1 = next), 0 if never queued
//	time      when it was rejected, RFC 3339 in UTC
type RejectStreamConfig struct {
	// Key of the stream, used as it is (KeyPrefix does not apply).
	// Placeholders known at load time, such as {env.REJECT_STREAM}, are
	// replaced. Required.
	Key string `json:"key,omitempty"`

	// MaxLen bounds the stream: each XADD trims it to about this many
	// entries (MAXLEN ~, which Redis applies by whole nodes of about a
	// hundred entries, so the stream may hold a few more). Default 10000.
	MaxLen int64 `json:"maxlen,omitempty"`

	// Fields adds fields to each entry: the field name, then a
	// placeholder template replaced when the request is rejected
	// (unknown placeholders become empty), such as
	// {http.request.header.X-Conversation-Id}. A value is cut to its
	// first 4 KiB. The names reason, queue, wait_ms, position and time
	// are taken; at most 32 fields. Values are written as they are: do
	// not record secrets such as the Authorization header.
	Fields map[string]string `json:"fields,omitempty"`
}

// Bounds and defaults of reject_stream.
const (
	// DefaultRejectStreamMaxLen is the default RejectStreamConfig.MaxLen.
	DefaultRejectStreamMaxLen = 10000
	maxRejectFields           = 32
	maxRejectFieldLen         = 4 << 10
	// rejectStreamBuffer bounds the records waiting to be written; more
	// are dropped, so that a slow Redis costs memory for no more.
	rejectStreamBuffer = 1024
	// rejectStreamTimeout bounds one XADD.
	rejectStreamTimeout = time.Second
	// rejectStreamGrace is how long records buffered at cleanup may
	// still be written.
	rejectStreamGrace = 2 * time.Second
	// rejectStreamWarnEvery rate-limits the Warn log of failures.
	rejectStreamWarnEvery = time.Minute
)

// rejectFieldNames are the fields every entry has.
var rejectFieldNames = []string{"reason", "queue", "wait_ms", "position", "time"}

// check validates the config; errors name the option.
func (c *RejectStreamConfig) check() error {
	switch {
	case c.Key == "":
		return optErr("reject_stream: key is required", "key", "is required")
	case c.MaxLen < 0:
		msg := fmt.Sprintf("must be at least 1, got %d", c.MaxLen)
		return optErr("reject_stream: maxlen "+msg, "maxlen", msg)
	case len(c.Fields) > maxRejectFields:
		return optErr(fmt.Sprintf("reject_stream: at most %d fields, got %d", maxRejectFields, len(c.Fields)),
			"fields", fmt.Sprintf("at most %d, got %d", maxRejectFields, len(c.Fields)))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Fields)) { // an error names the same field each load
		if err := checkRejectField(name); err != nil {
			return err
		}
	}
	return nil
}

func checkRejectField(name string) error {
	at := "fields[" + strconv.Quote(name) + "]"
	switch {
	case name == "":
		return optErr("reject_stream: a field name is empty", at, "a field name is empty")
	case slices.Contains(rejectFieldNames, name):
		builtIn := strings.Join(rejectFieldNames, ", ")
		return optErr(fmt.Sprintf("reject_stream: field '%s' is built in (%s are)", name, builtIn), at, fmt.Sprintf("is built in (%s are)", builtIn))
	}
	return nil
}

// rejectStream writes a handler's reject records from one worker
// goroutine, started by the first reject and stopped by close.
type rejectStream struct {
	key    string
	maxLen int64
	fields [][2]string // name, template; sorted by name
	rb     *redisBackend
	log    *zap.Logger

	mu      sync.Mutex
	records chan []any // nil until the first reject
	closed  bool
	cancel  context.CancelFunc // ends the worker's Redis calls
	grace   *time.Timer        // cancels them after close
	done    chan struct{}      // closed when the worker has ended

	dropped atomic.Int64 // records not buffered, since the last warning
}

// newRejectStream resolves cfg for a handler whose queues are in rb. It
// makes no network call.
func newRejectStream(cfg *RejectStreamConfig, rb *redisBackend, log *zap.Logger) (*rejectStream, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	key := caddy.NewReplacer().ReplaceKnown(cfg.Key, "")
	if key == "" {
		return nil, atLoad(optErr(fmt.Sprintf("reject_stream: key %q is empty once replaced", cfg.Key), "key", fmt.Sprintf("%q is empty once replaced", cfg.Key)))
	}
	s := &rejectStream{key: key, maxLen: cfg.MaxLen, rb: rb, log: log, done: make(chan struct{})}
	if s.maxLen == 0 {
		s.maxLen = DefaultRejectStreamMaxLen
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Fields)) {
		s.fields = append(s.fields, [2]string{name, cfg.Fields[name]})
	}
	return s, nil
}

// add records a reject. It reads the request's placeholders now (the
// replacer is not the worker's to read) and never blocks.
func (s *rejectStream) add(repl *caddy.Replacer, name string, rej *fairqueue.RejectError) {
	values := make([]any, 0, 2*(len(rejectFieldNames)+len(s.fields)))
	values = append(values,
		"reason", string(rej.Reason),
		"queue", name,
		"wait_ms", rej.Waited.Milliseconds(),
		"position", rej.Position,
		"time", time.Now().UTC().Format(time.RFC3339Nano))
	for _, f := range s.fields {
		values = append(values, f[0], truncateUTF8(repl.ReplaceAll(f[1], ""), maxRejectFieldLen))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		// A request that reached the handler after a reload cleaned it
		// up: the new config's handler records the next ones.
		s.log.Debug("reject_stream: handler cleaned up; reject not recorded", zap.String("stream", s.key))
		return
	}
	if s.records == nil {
		s.records = make(chan []any, rejectStreamBuffer)
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		go s.run(ctx, cancel, s.records)
	}
	select {
	case s.records <- values:
	default:
		s.dropped.Add(1)
	}
}

// close stops the worker: records already buffered are written for up
// to rejectStreamGrace, then dropped. It does not wait.
func (s *rejectStream) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if s.records == nil {
		close(s.done)
		return
	}
	close(s.records)
	s.grace = time.AfterFunc(rejectStreamGrace, s.cancel)
}

// run writes records until close, with a reference to the Redis client
// of the handler's queues (shared through the client pool) for as long
// as it runs.
func (s *rejectStream) run(ctx context.Context, cancel context.CancelFunc, records <-chan []any) {
	defer close(s.done)
	defer cancel()
	rdb, release, err := s.rb.client()
	if err != nil { // the constructor cannot fail; still, never spin
		s.log.Error("reject_stream: no Redis client", zap.String("stream", s.key), zap.Error(err))
		for range records {
		}
		return
	}
	defer release()

	var failed int64
	var lastErr error
	lastWarn := time.Now().Add(-rejectStreamWarnEvery)
	warn := func(force bool) {
		dropped := s.dropped.Load()
		if failed+dropped == 0 || (!force && time.Since(lastWarn) < rejectStreamWarnEvery) {
			return
		}
		s.dropped.Add(-dropped)
		s.log.Warn("reject_stream: rejects not recorded",
			zap.String("stream", s.key), zap.Int64("failed", failed), zap.Int64("dropped", dropped), zap.Error(lastErr))
		failed, lastErr, lastWarn = 0, nil, time.Now()
	}
	for values := range records {
		cctx, stop := context.WithTimeout(ctx, rejectStreamTimeout)
		err := rdb.XAdd(cctx, &redis.XAddArgs{Stream: s.key, MaxLen: s.maxLen, Approx: true, Values: values}).Err()
		stop()
		if err != nil {
			failed++
			lastErr = err
		}
		warn(false)
	}
	warn(true)
	s.mu.Lock()
	s.grace.Stop() // set by close before it closed records
	s.mu.Unlock()
}

// truncateUTF8 cuts s to at most n bytes, at a rune boundary: a copy,
// so that a record buffered for Redis does not keep the whole value it
// was cut from (a client's header, up to max_header_bytes).
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.Clone(s[:n])
}
