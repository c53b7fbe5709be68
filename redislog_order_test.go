package caddyfairqueue

import (
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// go-redis has one logger per process, which the first client of this
// package installs (routeRedisLogs): Caddy's redisLogger, or the
// command line's quiet one. In the test binary, Caddy's is installed
// before any test, as in a process where a Caddy server dialled first:
// else a test of Caddy's Redis logs (TestRedisClientLogsGoThroughCaddys
// LoggerAndDialOncePerAttempt) found none after a test that ran a
// command in the process (status --redis), and passed or failed with
// the order of the tests -run picked. The child process of
// TestCLIPrintsOnlyItsErrorWhenRedisIsDown is a command's process of its
// own, and keeps the quiet one.
func init() {
	if _, child := os.LookupEnv(cliChildArgs); !child {
		routeRedisLogs.Do(func() { redis.SetLogger(newRedisLogger(time.Now)) })
	}
}
