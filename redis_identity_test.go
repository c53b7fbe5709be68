package caddyfairqueue

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// go-redis sends CLIENT SETINFO on each connection it opens unless told
// not to, and CLIENT MAINT_NOTIFICATIONS on a RESP3 one; the ACL of
// docs/reference.md grants no CLIENT, so that a Redis that knows them
// (CLIENT SETINFO: 7.2 and later; MAINT_NOTIFICATIONS: Redis Cloud and
// Enterprise, newer servers) writes an ACL LOG entry per connection.
func TestEveryRedisClientIsBuiltWithoutClientSetinfo(t *testing.T) {
	for _, cfg := range []*RedisConfig{
		{Addresses: []string{"s1:1"}},
		{URL: "redis://s1:1/2"},
		{URL: "redis://s1:1/0?protocol=3"},
		{Mode: ModeSentinel, MasterName: "m1", Addresses: []string{"s1:1"}},
		{Mode: ModeCluster, Addresses: []string{"s1:1", "s2:1"}},
	} {
		b, err := newRedisBackend(cfg, caddy.NewReplacer())
		require.NoError(t, err)
		c := b.newClient()
		switch c := c.(type) {
		case *redis.Client: // standalone, and the failover client of Sentinel
			assert.True(t, c.Options().DisableIdentity, "mode %q", cfg.Mode)
			assert.False(t, c.Options().MaintNotificationsConfig.IsEnabled(), "mode %q", cfg.Mode)
		case *redis.ClusterClient:
			assert.True(t, c.Options().DisableIdentity, "mode %q", cfg.Mode)
			assert.False(t, c.Options().MaintNotificationsConfig.IsEnabled(), "mode %q", cfg.Mode)
		default:
			t.Fatalf("mode %q: unexpected client %T", cfg.Mode, c)
		}
		require.NoError(t, c.Close())
	}
	cli, err := cliRedis("redis://s1:1/0")
	require.NoError(t, err)
	assert.True(t, cli.Options().DisableIdentity, "the command line's client")
	assert.False(t, cli.Options().MaintNotificationsConfig.IsEnabled(), "the command line's client")
	co := cliClusterOptions(cli.Options())
	assert.True(t, co.DisableIdentity, "the command line's cluster client")
	assert.False(t, co.MaintNotificationsConfig.IsEnabled(), "the command line's cluster client")
	require.NoError(t, cli.Close())
}

func TestQueueConnectionsSendNoClientSetinfo(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	p := startRecordingProxy(t, redistest.Start(t).Addr())
	h := provision(t, newContext(t), "", &Handler{Name: "ident", Permits: 1, Redis: &RedisConfig{
		Addresses: []string{p.addr()},
	}})
	handsOverThePermit(t, h)

	rdb, _, err := cliClient(context.Background(), "redis://"+p.addr()+"/0")
	require.NoError(t, err)
	_, err = listQueues(context.Background(), rdb, "")
	require.NoError(t, err)
	require.NoError(t, rdb.Close())

	cmds := p.commands()
	assert.Contains(t, cmds, "EVALSHA", "the queue's scripts went through the proxy")
	assert.Contains(t, cmds, "SSUBSCRIBE", "and the subscription of its grants")
	assert.Contains(t, cmds, "SCAN", "and the command line's listing")
	for _, c := range cmds {
		assert.False(t, strings.HasPrefix(c, "CLIENT "), "the ACL grants no %s", c)
	}
}

// recordingProxy forwards each connection to a Redis server, byte for
// byte, and records the name of each command its clients send (with the
// subcommand of CLIENT).
type recordingProxy struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	cmds []string
	wg   sync.WaitGroup
}

func startRecordingProxy(t *testing.T, upstream string) *recordingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &recordingProxy{ln: ln, to: upstream}
	var conns sync.Map
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		p.wg.Wait()
	})
	return p
}

func (p *recordingProxy) addr() string { return p.ln.Addr().String() }

func (p *recordingProxy) commands() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.cmds...)
}

func (p *recordingProxy) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		_, _ = io.Copy(c, up)
		c.Close()
	}()
	r := bufio.NewReader(io.TeeReader(c, up))
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		name := strings.ToUpper(args[0])
		if name == "CLIENT" && len(args) > 1 {
			name += " " + strings.ToUpper(args[1])
		}
		p.mu.Lock()
		p.cmds = append(p.cmds, name)
		p.mu.Unlock()
	}
}

// readCommand reads one command of a client (a RESP array of bulk
// strings) and returns its arguments.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not a RESP array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad array length: %q", line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(line, "$") {
			return nil, errors.New("not a bulk string: " + line)
		}
		size, err := strconv.Atoi(strings.TrimSpace(line[1:]))
		if err != nil || size < 0 {
			return nil, fmt.Errorf("bad bulk length: %q", line)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}
