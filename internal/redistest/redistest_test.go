package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartServesEmptyNonPersistentRedis(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()

	require.NoError(t, c.Ping(ctx).Err())
	assert.Equal(t, fmt.Sprintf("127.0.0.1:%d", s.Port()), s.Addr())
	n, err := c.DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Zero(t, n)

	cfg, err := c.ConfigGet(ctx, "appendonly").Result()
	require.NoError(t, err)
	assert.Equal(t, "no", cfg["appendonly"])
	cfg, err = c.ConfigGet(ctx, "save").Result()
	require.NoError(t, err)
	assert.Equal(t, "", cfg["save"])
}

func TestWithArgsOverridesDefaults(t *testing.T) {
	t.Parallel()
	s := Start(t, WithArgs("--maxmemory", "12mb", "--appendonly", "yes"))
	cfg, err := s.Client(t).ConfigGet(context.Background(), "*").Result()
	require.NoError(t, err)
	assert.Equal(t, "12582912", cfg["maxmemory"])
	assert.Equal(t, "yes", cfg["appendonly"])
}

func TestParallelServersGetDistinctPorts(t *testing.T) {
	t.Parallel()
	a, b := Start(t), Start(t)
	assert.NotEqual(t, a.Port(), b.Port())
	ctx := context.Background()
	require.NoError(t, a.Client(t).Set(ctx, "k", "a", 0).Err())
	assert.Equal(t, redis.Nil, b.Client(t).Get(ctx, "k").Err())
}

func TestKeysListsMatchingKeysSorted(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	for i := range 2500 {
		require.NoError(t, c.Set(ctx, fmt.Sprintf("fq:{q}:t:%04d", i), 1, 0).Err())
	}
	require.NoError(t, c.Set(ctx, "other", 1, 0).Err())

	keys := s.Keys(t, "fq:*")
	require.Len(t, keys, 2500)
	assert.Equal(t, "fq:{q}:t:0000", keys[0])
	assert.Equal(t, "fq:{q}:t:2499", keys[2499])
	assert.Empty(t, s.Keys(t, "none:*"))
}

func TestKillMakesServerUnreachableAndRestartComesBackEmptyOnSamePort(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t, func(o *redis.Options) {
		o.DialTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	})
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	port := s.Port()

	s.Kill()
	require.Error(t, c.Ping(ctx).Err())
	s.Kill() // killing a dead server is a no-op

	s.Restart()
	assert.Equal(t, port, s.Port())
	require.NoError(t, c.Ping(ctx).Err())
	assert.Equal(t, redis.Nil, c.Get(ctx, "k").Err())
}

func TestFreezeStallsCommandsUntilThaw(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	})
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx).Err())

	s.Freeze()
	err := c.Ping(ctx).Err()
	var netErr interface{ Timeout() bool }
	require.True(t, errors.As(err, &netErr) && netErr.Timeout(), "want a timeout, got %v", err)

	s.Thaw()
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 20*time.Millisecond)
}

func TestStopShutsDownGracefullyEvenWhenFrozen(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Freeze()
	s.Stop()
	b, err := os.ReadFile(s.logPath)
	require.NoError(t, err)
	assert.Contains(t, string(b), "ready to exit, bye bye")

	s.Restart()
	require.NoError(t, s.Client(t).Ping(context.Background()).Err())
}

// fatalTB records Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestStartFailsWithInstallHintWhenRedisServerMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(tb)
		t.Error("Start returned without redis-server in PATH")
	}()
	<-done
	assert.Contains(t, tb.msg, "scripts/ensure-redis.sh")
}

func TestStartReportsLogTailWhenRedisRefusesArgs(t *testing.T) {
	t.Parallel()
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(tb, WithArgs("--no-such-option", "1"))
	}()
	<-done
	assert.True(t, strings.Contains(tb.msg, "no-such-option"), "message lacks the log tail:\n%s", tb.msg)
}

func TestRestartFailsWhenAnotherProcessHoldsThePort(t *testing.T) {
	t.Parallel()
	tb := &fatalTB{TB: t}
	s := Start(tb)
	s.Kill()
	l, err := net.Listen("tcp", s.Addr())
	require.NoError(t, err)
	defer l.Close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Restart()
		t.Error("Restart returned while the port was taken")
	}()
	<-done
	assert.Contains(t, tb.msg, "port in use")
	assert.Contains(t, tb.msg, "Address already in use")
}
