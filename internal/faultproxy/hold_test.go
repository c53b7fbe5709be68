package faultproxy

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// startSink starts a server on a free loopback port that sends each line
// any connection brings it to the returned channel, as it reads it.
func startSink(t *testing.T) (string, <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
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
			wg.Go(func() {
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					lines <- line
				}
			})
		}
	})
	return ln.Addr().String(), lines
}

// next returns the next line lines brings within 5s.
func next(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l := <-lines:
		return l
	case <-time.After(5 * time.Second):
		t.Fatal("no line reached the upstream")
		return ""
	}
}

func TestFaultProxyHoldNextHoldsOneConnectionsRequestPastItsClose(t *testing.T) {
	addr, lines := startSink(t)
	p := Start(t, addr)
	c1, c2 := dial(t, p), dial(t, p)
	held, release := p.HoldNext([]byte("register"))
	if _, err := io.WriteString(c1, "first\n"); err != nil {
		t.Fatal(err)
	}
	if got := next(t, lines); got != "first\n" {
		t.Fatalf("a line the hold does not match: %q", got)
	}
	if _, err := io.WriteString(c1, "register\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the matching line was not held")
	}
	c1.Close() // its client gives up: what it sent still goes out, late
	if _, err := io.WriteString(c2, "leave\n"); err != nil {
		t.Fatal(err)
	}
	if got := next(t, lines); got != "leave\n" {
		t.Fatalf("another connection's line, sent later: %q first", got)
	}
	release()
	release()
	if got := next(t, lines); got != "register\n" {
		t.Fatalf("the held line once released: %q", got)
	}
	// The hold is spent: a second match goes through.
	if _, err := io.WriteString(c2, "register\n"); err != nil {
		t.Fatal(err)
	}
	if got := next(t, lines); got != "register\n" {
		t.Fatalf("a second match: %q", got)
	}
}
