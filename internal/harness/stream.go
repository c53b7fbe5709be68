package harness

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// Stream is a streaming chat completion that a test started to take a
// place in a queue: it holds a permit, or waits for one, until Release.
type Stream struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartStream sends a streaming chat completion to url (the whole
// /v1/chat/completions URL) whose answer from the mock lasts about 10
// minutes, reads it in the background, and returns at once. Release, or
// the end of the test, ends it.
func StartStream(t testing.TB, url string) *Stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url,
		strings.NewReader(`{"model":"mock","stream":true,"messages":[{"role":"user","content":"hold"}]}`))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(mockllm.HeaderTokens, "6000")
	req.Header.Set(mockllm.HeaderDelay, "100ms")
	s := &Stream{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return // released, or Caddy is gone
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	t.Cleanup(s.Release)
	return s
}

// Release ends the stream, which gives back its permit or leaves the
// queue, and waits until the request has returned.
func (s *Stream) Release() {
	s.cancel()
	<-s.done
}
