// Package faultproxy is a TCP proxy for tests that puts network faults
// between its clients and one upstream: latency, a blackhole (a partition
// in which TCP stays up) and a cut (every connection reset). It stands in
// for toxiproxy, in-process. A fault applies at once to every current and
// future connection, but HoldNext, which holds one connection's request.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

const (
	dialTimeout = 2 * time.Second
	chunkSize   = 16 << 10
	// queued bounds the chunks read ahead of the writer per direction, so
	// a blackholed link pushes back on its sender as TCP's window would.
	queued = 64
)

// Proxy forwards every connection accepted on Addr to the upstream. Its
// methods are safe for concurrent use.
type Proxy struct {
	upstream string
	ln       net.Listener
	ctx      context.Context // ends with Close
	stop     context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	latency   time.Duration
	blackhole bool
	cut       bool
	changed   chan struct{} // closed and replaced at every fault change
	links     map[*link]struct{}
	closed    bool
	armed     *hold // the next client chunk it matches is held (HoldNext)
}

// link is one proxied connection: the client's and the upstream's ends.
type link struct {
	client, server net.Conn
	done           chan struct{} // closed when the link is closed
	once           sync.Once
}

// chunk is what one read got, and when: it is written latency later,
// and not before release is closed where it has one (HoldNext).
type chunk struct {
	b       []byte
	at      time.Time
	release <-chan struct{}
}

// New starts a proxy to upstream (host:port) on a free loopback port.
func New(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{upstream: upstream, ln: ln, changed: make(chan struct{}), links: make(map[*link]struct{})}
	p.ctx, p.stop = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Start is New for a test: it fails tb on error and closes the proxy when
// tb ends.
func Start(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	p, err := New(upstream)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays each chunk by d in each direction (a round trip takes
// 2d more); 0 removes the delay. Throughput is not capped: chunks are
// delayed, not serialized.
func (p *Proxy) SetLatency(d time.Duration) { p.update(func() { p.latency = d }) }

// Blackhole, on, stops forwarding in both directions while connections
// stay open and new ones are accepted: clients see read timeouts, not
// errors. The bytes are held, not dropped, and arrive in order once the
// blackhole ends, as TCP's retransmissions deliver them after a partition
// shorter than its timeout: a request its client gave up on may still
// reach the upstream late.
func (p *Proxy) Blackhole(on bool) { p.update(func() { p.blackhole = on }) }

// Cut resets every connection and, until Heal, resets each new one as
// soon as it is accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	links := p.takeLinksLocked()
	p.mu.Unlock()
	for _, l := range links {
		p.closeLink(l, true)
	}
}

// Heal ends every fault: cut, blackhole and latency. Held bytes go out.
func (p *Proxy) Heal() {
	p.update(func() { p.cut, p.blackhole, p.latency = false, false, 0 })
}

// Close stops accepting, closes every connection and waits for every
// goroutine of the proxy to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	first := !p.closed
	p.closed = true
	links := p.takeLinksLocked()
	p.mu.Unlock()
	if first {
		p.stop()
		_ = p.ln.Close()
	}
	for _, l := range links {
		p.closeLink(l, false)
	}
	p.wg.Wait()
}

func (p *Proxy) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed) // wakes every writer holding a chunk
	p.changed = make(chan struct{})
}

func (p *Proxy) takeLinksLocked() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	clear(p.links)
	return links
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of descriptors, say: try again soon
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the upstream for client c and starts the link's four
// goroutines: a reader and a writer per direction.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	defer cancel()
	var s net.Conn
	var err error
	if !p.isCut() {
		s, err = (&net.Dialer{}).DialContext(ctx, "tcp", p.upstream)
	}
	l := &link{client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if s == nil || err != nil || p.cut || p.closed {
		p.mu.Unlock()
		p.closeLink(l, true)
		return
	}
	p.links[l] = struct{}{}
	p.wg.Add(4)
	p.mu.Unlock()
	up, down := make(chan chunk, queued), make(chan chunk, queued)
	go p.read(l, c, up, true)
	go p.write(l, s, up)
	go p.read(l, s, down, false)
	go p.write(l, c, down)
}

func (p *Proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// read reads src into out; fromClient: the client's end, whose chunks
// HoldNext may hold.
func (p *Proxy) read(l *link, src net.Conn, out chan<- chunk, fromClient bool) {
	defer p.wg.Done()
	defer close(out)
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			c := chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}
			if fromClient {
				c.release = p.held(c.b)
			}
			select {
			case out <- c:
			case <-l.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write forwards the chunks of one direction when their time comes; the
// link ends with its first direction to end.
func (p *Proxy) write(l *link, dst net.Conn, in <-chan chunk) {
	defer p.wg.Done()
	defer p.closeLink(l, false)
	for c := range in {
		if c.release != nil {
			select {
			case <-c.release:
			case <-l.done:
				return
			}
		}
		if !p.hold(l, c.at) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// hold waits until a chunk read at may go: no blackhole, and the latency
// since at has passed. It reports false if the link closed meanwhile.
func (p *Proxy) hold(l *link, at time.Time) bool {
	for {
		p.mu.Lock()
		blackhole, wait, changed := p.blackhole, time.Until(at.Add(p.latency)), p.changed
		p.mu.Unlock()
		if !blackhole && wait <= 0 {
			return true
		}
		var timer *time.Timer
		var due <-chan time.Time
		if !blackhole {
			timer = time.NewTimer(wait)
			due = timer.C
		}
		select {
		case <-due:
		case <-changed:
		case <-l.done:
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-l.done:
			return false
		default:
		}
	}
}

// closeLink closes both ends of l, once; reset sends RST instead of FIN.
func (p *Proxy) closeLink(l *link, reset bool) {
	l.once.Do(func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		for _, c := range []net.Conn{l.client, l.server} {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
		close(l.done)
	})
}
