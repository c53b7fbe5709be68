package faultproxy

import (
	"bytes"
	"sync"
)

// hold is an armed HoldNext: the first client chunk holding match is
// held until release is closed; held is closed once one was.
type hold struct {
	match   []byte
	held    chan struct{}
	release chan struct{}
}

// HoldNext holds, on its way to the upstream, the next chunk a client
// sends that contains match, and every chunk after it on that
// connection, until release is called; held is closed once such a chunk
// came. The other connections go on: a request held so reaches the
// upstream after requests sent later on other connections, as one that
// a loaded server reads late does, even where its client gave up on it
// and closed its connection meanwhile (the bytes it sent before still
// go out, then the close). A HoldNext replaces one not yet matched.
// release may be called more than once; Heal does not release.
func (p *Proxy) HoldNext(match []byte) (held <-chan struct{}, release func()) {
	h := &hold{match: bytes.Clone(match), held: make(chan struct{}), release: make(chan struct{})}
	p.mu.Lock()
	p.armed = h
	p.mu.Unlock()
	var once sync.Once
	return h.held, func() { once.Do(func() { close(h.release) }) }
}

// held returns the release channel of client chunk b where an armed
// HoldNext matches it (the hold is then spent), else nil.
func (p *Proxy) held(b []byte) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.armed
	if h == nil || !bytes.Contains(b, h.match) {
		return nil
	}
	p.armed = nil
	close(h.held)
	return h.release
}
