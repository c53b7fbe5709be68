package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// sseBlocks reads a response body as server-sent events, one block (the
// lines up to a blank line) at a time; the channel closes at its end.
func sseBlocks(resp *http.Response) <-chan string {
	ch := make(chan string, 1000)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		var block []string
		for sc.Scan() {
			if line := sc.Text(); line != "" {
				block = append(block, line)
				continue
			}
			ch <- strings.Join(block, "\n")
			block = nil
		}
	}()
	return ch
}

// readAll returns the blocks left, failing the test if the stream does
// not end within d.
func readAll(t *testing.T, ch <-chan string, d time.Duration) []string {
	t.Helper()
	deadline := time.After(d)
	var out []string
	for {
		select {
		case b, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, b)
		case <-deadline:
			t.Fatalf("stream did not end within %v; got %q", d, out)
		}
	}
}

func TestKeepaliveFeedsAWaitingStreamThenRelaysOrRejects(t *testing.T) {
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 8, Delay: 10 * time.Millisecond})
	c := harness.StartCaddy(t, "caddy", proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		max_wait 2s
		sse_keepalive 200ms
		redis redis://%s/0
		reject_stream app:busy {
			field conversation {http.request.header.X-Conversation-Id}
		}
	}`, rds.Addr())), harness.CaddyOptions{})
	client := newClient(t)

	open := func(t *testing.T, conversation string) (*http.Response, <-chan string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		t.Cleanup(cancel)
		req := Chat{Stream: true, Header: http.Header{"X-Conversation-Id": {conversation}}}.request(ctx, c.URL())
		resp, err := client.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		assert.Equal(t, "no", resp.Header.Get("X-Accel-Buffering"))
		assert.Empty(t, resp.Header.Get("Fair-Queue-Reason"))
		return resp, sseBlocks(resp)
	}

	t.Run("granted after waiting: comments, then the whole upstream stream", func(t *testing.T) {
		holder := holdPermit(t, client, c.URL(), nil)
		_, ch := open(t, "c-1")
		for range 2 {
			select {
			case b := <-ch:
				assert.Regexp(t, `^: queued (position=\d+ )?(eta=\d+s )?waited=\d+s$`, b)
			case <-time.After(5 * time.Second):
				t.Fatal("no keepalive comment within 5s")
			}
		}
		holder.Release()
		var data []string
		for _, b := range readAll(t, ch, 30*time.Second) {
			if !strings.HasPrefix(b, ":") {
				data = append(data, b)
			}
		}
		require.NotEmpty(t, data)
		assert.Len(t, data, 9, "8 tokens and [DONE]: %q", data)
		assert.Equal(t, "data: [DONE]", data[len(data)-1])
	})

	t.Run("rejected after waiting: the reject event, and one stream entry", func(t *testing.T) {
		holder := holdPermit(t, client, c.URL(), nil)
		defer holder.Release()
		_, ch := open(t, "c-2")
		blocks := readAll(t, ch, 30*time.Second)
		require.GreaterOrEqual(t, len(blocks), 2, "comments, then the reject: %q", blocks)
		for _, b := range blocks[:len(blocks)-1] {
			assert.Regexp(t, `^: queued`, b)
		}
		last := blocks[len(blocks)-1]
		require.True(t, strings.HasPrefix(last, "event: error\ndata: "), "last event %q", last)
		var e apiError
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(last, "event: error\ndata: ")), &e))
		assert.Equal(t, "timeout", e.Error.Code, "the reason is in the data")

		rdb := rds.Client(t)
		var fields map[string]any
		require.True(t, eventually(5*time.Second, func() bool {
			entries, err := rdb.XRange(context.Background(), "app:busy", "-", "+").Result()
			if err != nil || len(entries) == 0 {
				return false
			}
			require.Len(t, entries, 1)
			fields = entries[0].Values
			return true
		}), "no reject record in the stream")
		assert.Equal(t, "timeout", fields["reason"])
		assert.Equal(t, "default", fields["queue"])
		assert.Equal(t, "c-2", fields["conversation"])
	})
}
