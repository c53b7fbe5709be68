package caddyfairqueue

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
)

// stuckWriter is the response of a client that reads nothing: over
// HTTP/2 one that leaves its stream's flow-control window at 0
// (SETTINGS_INITIAL_WINDOW_SIZE 0), over HTTP/1 one whose TCP buffers are
// full. As the servers do, it buffers 4 KiB of body; a flush of what it
// buffered (or a write beyond that) blocks until the client reads, which
// it never does, or until a write deadline set on the stream
// (http.ResponseController) passes.
type stuckWriter struct {
	header http.Header
	mu     sync.Mutex
	wake   chan struct{} // closed and replaced when the deadline changes
	dl     time.Time
	buf    int // bytes buffered, not yet sent
}

func newStuckWriter() *stuckWriter {
	return &stuckWriter{header: make(http.Header), wake: make(chan struct{})}
}

func (s *stuckWriter) Header() http.Header { return s.header }
func (s *stuckWriter) WriteHeader(int)     {}

func (s *stuckWriter) FlushError() error {
	s.mu.Lock()
	empty := s.buf == 0
	s.mu.Unlock()
	if empty {
		return nil
	}
	_, err := s.block()
	return err
}

func (s *stuckWriter) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.dl = t
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
	return nil
}

func (s *stuckWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	if s.buf+len(b) <= 4<<10 {
		s.buf += len(b)
		s.mu.Unlock()
		return len(b), nil
	}
	s.mu.Unlock()
	return s.block()
}

// block waits for the write deadline.
func (s *stuckWriter) block() (int, error) {
	for {
		s.mu.Lock()
		dl, wake := s.dl, s.wake
		s.mu.Unlock()
		var expired <-chan time.Time
		if !dl.IsZero() {
			if !time.Now().Before(dl) {
				return 0, os.ErrDeadlineExceeded
			}
			expired = time.After(time.Until(dl))
		}
		select {
		case <-wake:
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// A streaming request whose client reads nothing still ends at max_wait
// (within the bound on the queue's own frames): its reject is an SSE
// event, flushed, and with sse_keepalive each comment is flushed too,
// from the keepalive's goroutine, which halt waits for. Unbounded, the
// flush blocked on the client and the request never ended, holding its
// queue's slot among the handler's 100: one HTTP/2 connection at window
// 0 with 100 such streams to made-up names kept every new name out for
// as long as it stayed open.
func TestAStreamWhoseClientReadsNothingEndsAtMaxWait(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name      string
		keepalive time.Duration
	}{
		{"sse_keepalive", 100 * time.Millisecond},
		{"no keepalive", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionLocal(t, newContext(t), &Handler{Name: "stuck-" + strings.ReplaceAll(tc.name, " ", "-"), Permits: 1,
				MaxWait: caddy.Duration(500 * time.Millisecond), SSEKeepalive: caddy.Duration(tc.keepalive)})
			holdPermit(t, h)

			req := newRequest(context.Background(), `{"model":"m","stream":true}`)
			w := newStuckWriter()
			done := make(chan error, 1)
			go func() { done <- h.ServeHTTP(w, req.r, okHandler) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				assert.Fail(t, "the request still runs 5s after its max_wait of 500ms, holding its queue")
				_ = w.SetWriteDeadline(time.Now()) // let it end, for the cleanup
				<-done
			}
		})
	}
}
