package caddyfairqueue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// redisLogEvery is how often one go-redis line is logged while it
// repeats: a dead Redis fails every dial the same way.
const redisLogEvery = 10 * time.Second

// redisLogKeys bounds the lines remembered; beyond it they are forgotten
// and logged again.
const redisLogKeys = 256

// routeRedisLogs installs the redisLogger before the first client dials.
var routeRedisLogs sync.Once

// redisLogger sends go-redis's log lines (a failed dial, a bad
// connection dropped) to Caddy's default logger, as structured warnings
// of logger "redis", instead of go-redis's own unstructured lines on
// stderr, and logs a line that repeats once per redisLogEvery, with the
// number of repeats left out (field "repeated"). go-redis has one logger
// per process: this one also carries the lines of any other module's
// go-redis clients.
type redisLogger struct {
	now func() time.Time

	mu   sync.Mutex
	seen map[string]*redisLogLine // by message
}

// redisLogLine is a message logged lately.
type redisLogLine struct {
	at       time.Time // when it was last logged
	repeated int       // times left out since
}

func newRedisLogger(now func() time.Time) *redisLogger {
	return &redisLogger{now: now, seen: make(map[string]*redisLogLine)}
}

// Printf implements go-redis's logging interface.
func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	now := l.now()
	l.mu.Lock()
	line := l.seen[msg]
	if line != nil && now.Sub(line.at) < redisLogEvery {
		line.repeated++
		l.mu.Unlock()
		return
	}
	repeated := 0
	if line != nil {
		repeated = line.repeated
	} else if len(l.seen) >= redisLogKeys {
		clear(l.seen)
	}
	l.seen[msg] = &redisLogLine{at: now}
	l.mu.Unlock()
	if repeated > 0 {
		caddy.Log().Named("redis").Warn(msg, zap.Int("repeated", repeated))
		return
	}
	caddy.Log().Named("redis").Warn(msg)
}
