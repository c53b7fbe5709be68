package notifier_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
	"github.com/fair-queue/caddy-fair-queue/notifier"
)

// severProxy forwards TCP connections to upstream; sever makes every
// connection open now silent in both directions (bytes are dropped,
// nothing is closed: a peer that vanished, a partition longer than it
// heals, a middlebox that forgot the flow), while new connections are
// forwarded normally (the client reaches Redis again on a fresh one).
type severProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	gen      int
}

func startSeverProxy(t *testing.T, upstream string) *severProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &severProxy{ln: ln, upstream: upstream}
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		_ = ln.Close()
		cmu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		cmu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			cmu.Lock()
			conns = append(conns, c, u)
			cmu.Unlock()
			p.mu.Lock()
			gen := p.gen
			p.mu.Unlock()
			go p.pipe(c, u, gen)
			go p.pipe(u, c, gen)
		}
	}()
	return p
}

func (p *severProxy) addr() string { return p.ln.Addr().String() }

func (p *severProxy) sever() {
	p.mu.Lock()
	p.gen++
	p.mu.Unlock()
}

func (p *severProxy) pipe(dst, src net.Conn, gen int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		alive := p.gen == gen
		p.mu.Unlock()
		if n > 0 && alive {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// A subscription whose connection goes silent (no reset, no FIN: its
// pong never comes back) must be found dead by its ping and replaced,
// as the package promises ("a subscription silent for pingAfter is
// pinged, so that a broken connection is found and replaced"), and the
// new one reported through Subscribed. The ping's write succeeds on a
// half-open connection, and the pong is never awaited: the read blocks
// with no deadline, so the node hears no grant again (and no Resynced)
// until the kernel gives up on the connection, minutes later.
func TestHalfOpenSubscriptionIsFoundByItsPingAndReplaced(t *testing.T) {
	srv := redistest.Start(t)
	p := startSeverProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	pub := srv.Client(t)
	ctx := context.Background()
	ev := newEvents()
	sub, err := notifier.Subscribe(ctx, rdb, "node:a", false, ev.listener())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	require.NoError(t, pub.Publish(ctx, "node:a", "before").Err())
	require.Equal(t, "before", ev.message(t, 5*time.Second))

	p.sever()
	start := time.Now()
	const within = 15 * time.Second // pingAfter (2s) + confirmTimeout (5s) + slack
	select {
	case <-ev.subscribed:
		t.Logf("subscribed again %v after the connection went silent", time.Since(start).Round(time.Millisecond))
	case <-time.After(within):
		t.Fatalf("a silent (half-open) subscription was not replaced within %v: grants published to the node are never heard", within)
	}
	require.NoError(t, pub.Publish(ctx, "node:a", "after").Err())
	require.Equal(t, "after", ev.message(t, 5*time.Second))
}
