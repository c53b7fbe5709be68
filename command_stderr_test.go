package caddyfairqueue

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cliChildArgs, when set, makes TestCLIPrintsOnlyItsErrorWhenRedisIsDown
// the command itself, in a process of its own: go-redis has one logger per
// process, which writes to the stderr it found at start, so only a fresh
// process shows what an operator's terminal shows.
const cliChildArgs = "FAIR_QUEUE_CLI_CHILD_ARGS"

// runCLIChild runs `caddy fair-queue <args>` in a fresh process (this
// test binary, re-run as the command) and returns its stdout and stderr.
func runCLIChild(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCLIPrintsOnlyItsErrorWhenRedisIsDown$", "-test.count=1")
	cmd.Env = append(os.Environ(), cliChildArgs+"="+strings.Join(args, "\x1f"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// An operator who runs status or purge against a Redis that is down sees
// the command's error, naming the server, and nothing else: not go-redis's
// own log lines (timestamped, with its source file and line), once per
// call it retried.
func TestCLIPrintsOnlyItsErrorWhenRedisIsDown(t *testing.T) {
	if raw, ok := os.LookupEnv(cliChildArgs); ok {
		root := &cobra.Command{Use: "fair-queue", SilenceUsage: true, SilenceErrors: true}
		setupFairQueueCommand(root)
		root.SetArgs(strings.Split(raw, "\x1f"))
		if err := root.ExecuteContext(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "Error:", err) // as caddy's main does
			os.Exit(1)
		}
		os.Exit(0)
	}
	dead := deadAddr(t)
	for _, args := range [][]string{
		{"status", "--redis", "redis://" + dead},
		{"status", "--redis", "redis://" + dead, "--queue", "chat"},
		{"purge", "--redis", "redis://" + dead, "--queue", "chat", "--yes"},
		{"purge", "--redis", "redis://" + dead, "--dead", "--yes"},
	} {
		t.Run(strings.Join(args[:1], " ")+" "+strings.Join(args[3:], " "), func(t *testing.T) {
			_, stderr, err := runCLIChild(t, args...)
			require.Error(t, err, "a non-zero exit")
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			assert.Len(t, lines, 1, "one line, the command's error:\n%s", stderr)
			assert.True(t, strings.HasPrefix(lines[0], "Error: "), "the command's error: %q", lines[0])
			assert.Contains(t, lines[0], dead, "it names the server")
			assert.NotContains(t, stderr, "pool.go", "no go-redis log line")
		})
	}
}

// The command's client dials once per attempt, as Caddy's does (redis.go):
// go-redis's default dials 5 times, 100ms apart, per attempt.
func TestCLIRedisDialsOncePerAttempt(t *testing.T) {
	c, err := cliRedis("redis://" + deadAddr(t))
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, 1, c.Options().DialerRetries)
}
