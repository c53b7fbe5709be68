package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// startEcho starts a line echo server on a free loopback port.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	return ln.Addr().String()
}

// dial connects to p and fails the test if it cannot.
func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial the proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echo writes line and reads it back within d, returning the error and
// how long the round trip took.
func echo(c net.Conn, line string, d time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(d))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return 0, err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && got != line+"\n" {
		err = errors.New("echoed " + got)
	}
	return time.Since(start), err
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

func TestFaultProxyForwardsBothWays(t *testing.T) {
	p := Start(t, startEcho(t))
	c := dial(t, p)
	for _, line := range []string{"one", "two", strings.Repeat("x", 100_000)} {
		if _, err := echo(c, line, 5*time.Second); err != nil {
			t.Fatalf("echo of %d bytes: %v", len(line), err)
		}
	}
}

func TestFaultProxyLatencyDelaysEachDirectionWithoutCappingThroughput(t *testing.T) {
	p := Start(t, startEcho(t))
	c := dial(t, p)
	const d = 100 * time.Millisecond
	p.SetLatency(d)
	took, err := echo(c, "hello", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took < 2*d {
		t.Errorf("round trip %v with latency %v each way, want at least %v", took, d, 2*d)
	}
	// Ten pipelined lines come back after about one round trip, not ten.
	start := time.Now()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(start.Add(5 * time.Second))
	for i := range 10 {
		if _, err := io.WriteString(c, "line\n"); err != nil {
			t.Fatal(err)
		}
		if i < 9 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	for range 10 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took > 2*d+time.Second/2 {
		t.Errorf("ten pipelined lines took %v: latency is serializing chunks", took)
	}
	p.SetLatency(0)
	if took, err := echo(c, "fast", 5*time.Second); err != nil || took > 2*d {
		t.Errorf("after SetLatency(0): %v, %v", took, err)
	}
}

func TestFaultProxyBlackholeKeepsConnectionsOpenAndHoldsBytesUntilLifted(t *testing.T) {
	p := Start(t, startEcho(t))
	c := dial(t, p)
	if _, err := echo(c, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole(true)
	if _, err := echo(c, "held", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed connection: %v, want a read timeout", err)
	}
	// A new connection is accepted, and goes nowhere either.
	c2 := dial(t, p)
	if _, err := echo(c2, "new", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection in a blackhole: %v, want a read timeout", err)
	}
	p.Blackhole(false)
	// The held line arrives now, then the link works as before.
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("held line after the blackhole: %q, %v", got, err)
	}
	if _, err := io.WriteString(c, "after\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := r.ReadString('\n'); err != nil || got != "after\n" {
		t.Fatalf("after the blackhole: %q, %v", got, err)
	}
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(c2).ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("connection opened in the blackhole, after it: %q, %v", got, err)
	}
}

func TestFaultProxyCutResetsEveryConnectionUntilHeal(t *testing.T) {
	p := Start(t, startEcho(t))
	c := dial(t, p)
	if _, err := echo(c, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	// The open connection fails at once: an error, not a timeout.
	start := time.Now()
	if _, err := echo(c, "cut", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("cut connection: %v, want a reset", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("cut connection failed after %v, want at once", took)
	}
	// New ones are reset until Heal.
	if c2, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		if _, err := echo(c2, "refused", 5*time.Second); err == nil || isTimeout(err) {
			t.Errorf("new connection while cut: %v, want a reset", err)
		}
		c2.Close()
	}
	p.Heal()
	if _, err := echo(dial(t, p), "healed", 5*time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
}

func TestFaultProxyHealEndsEveryFault(t *testing.T) {
	p := Start(t, startEcho(t))
	c := dial(t, p)
	p.SetLatency(time.Second)
	p.Blackhole(true)
	p.Heal()
	if took, err := echo(c, "healed", 5*time.Second); err != nil || took > 500*time.Millisecond {
		t.Fatalf("after Heal: %v, %v", took, err)
	}
}

func TestFaultProxyCloseEndsEveryGoroutineAndConnection(t *testing.T) {
	upstream := startEcho(t)
	before := runtime.NumGoroutine()
	p, err := New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 5 {
		c := dial(t, p)
		if _, err := echo(c, "x", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	p.Blackhole(true)
	for _, c := range conns {
		_, _ = io.WriteString(c, "held\n") // a writer holds a chunk
	}
	p.SetLatency(time.Hour)
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	p.Close() // twice is fine
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("connection after Close: %v, want closed", err)
		}
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("the proxy accepts after Close")
	}
	// The echo server's goroutines end as the proxy's connections close.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, %d before New", n, before)
	}
}
