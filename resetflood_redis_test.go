package caddyfairqueue

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// HTTP/2 streams sent with their whole body and reset at once (frames
// written by hand, as a client flooding a server with resets sends
// them) cost Redis nothing: each one's client has left before its
// request would go out, and leaves no tombstone there. Before, each was
// sent, failed on its ended context, and was cancelled in the
// background with a tombstone kept for 30 s: 200 streams, 200
// tombstones. A reset the server handles in the instant between the
// handler's look at the context and the call going out still costs a
// cancel and a tombstone (on a loaded machine, about one stream in
// 2,000): a few are let through.
func TestStreamsResetWithTheirBodyLeaveNoTombstonesInRedis(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	up := newHeldUpstream(t)
	name := "reset-with-body"
	s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","redis":{"addresses":[%q]}}`,
		name, rds.Addr()), up.proxy())
	running := chat(context.Background(), s.client(t, "h2"), s.url, `{}`) // the queue is open and joined
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	headers, reset, settled := resetStreams(t, s)
	const n = 200
	for i := range n {
		reset(uint32(2*i+1), nil)
	}
	// A last stream on the connection, not reset. Once the server
	// answers a ping sent after it, it has handled every reset: no reset
	// stream can be granted for its client from then on. A waiter seen
	// before that may be a reset stream whose handler ran ahead of the
	// server's reading of its reset (on a loaded machine): released to,
	// it would reach the upstream and take the release meant for the
	// last stream. Once no handler runs, the handlers of the reset
	// streams are done.
	headers(2*n+1, nil)
	settled()
	waitQueueWaiting(t, name, 1)
	up.release <- struct{}{}
	assert.Equal(t, http.StatusOK, got(t, running).status)
	require.Eventually(t, func() bool { return up.total.Load() == 2 && up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	up.release <- struct{}{}
	require.Eventually(t, func() bool { return up.run.Load() == 0 && handlersRunning() == 0 }, 10*time.Second, 5*time.Millisecond)

	rdb := rds.Client(t)
	marks, err := rdb.ZRange(context.Background(), redisstore.TagOf("", name)+":gone", 0, -1).Result()
	require.NoError(t, err)
	var tickets int
	for _, m := range marks {
		if strings.Contains(m, ":") { // a ticket's ID; a node's has no colon
			tickets++
		}
	}
	t.Logf("%d of %d reset streams left a tombstone", tickets, n)
	assert.LessOrEqual(t, tickets, n/20, "reset streams left tombstones in Redis")
	assert.Equal(t, int32(2), up.total.Load(), "a reset stream reached the upstream")
}

// resetStreams opens an HTTP/2 connection to s whose frames are written
// by hand: headers sends a request on stream id with a body of {} (and
// extra header fields), reset sends one and resets it at once, settled
// pings the server and waits for its answer: the server has then
// handled every frame sent before (each reset stream's context has
// ended). The server's other frames are read and dropped.
func resetStreams(t *testing.T, s *tlsCaddy) (headers, reset func(id uint32, extra [][2]string), settled func()) {
	t.Helper()
	conn, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.roots, ServerName: "localhost", NextProtos: []string{"h2"}})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = io.WriteString(conn, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	require.NoError(t, fr.WriteSettings())
	pongs := make(chan [8]byte, 16)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				pongs <- p.Data
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	headers = func(id uint32, extra [][2]string) {
		hb.Reset()
		for _, f := range append([][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "localhost"},
			{":path", "/v1/chat/completions"}, {"content-length", "2"}}, extra...) {
			require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
		}
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}))
		require.NoError(t, fr.WriteData(id, true, []byte(`{}`)))
	}
	reset = func(id uint32, extra [][2]string) {
		headers(id, extra)
		require.NoError(t, fr.WriteRSTStream(id, http2.ErrCodeCancel))
	}
	var pings byte
	settled = func() {
		pings++
		sent := [8]byte{pings}
		require.NoError(t, fr.WritePing(false, sent))
		timeout := time.After(10 * time.Second)
		for {
			select {
			case pong := <-pongs:
				if pong == sent {
					return
				}
			case <-timeout:
				t.Fatal("the server did not answer a ping within 10s")
			}
		}
	}
	return headers, reset, settled
}

// Streams reset with their body, each naming a queue of its own (a
// name taken from the request), join no queue in Redis: their clients
// have left before the queue would join the store. Before, each joined
// its queue there (its node, its subscription to its grants, then its
// keys) for nobody, kept until the handler gave the queue back 10 s
// later: 50 streams, 50 queues in Redis. A stream whose handler runs
// before the server has read its reset (the reset is the next frame,
// read after the handler starts; on a loaded machine several handlers
// get ahead) cannot be told from one that stays: it joins its queue and
// may even be forwarded, until the reset ends it. A fifth of the streams
// are let through for that, and no reset stream reaches the upstream
// that did not join first.
func TestStreamsResetWithTheirBodyJoinNoQueueInRedis(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	up := newHeldUpstream(t)
	s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":"{http.request.header.X-Queue}","permits":1,"max_wait":"60s",
		"redis":{"addresses":[%q]}}`, rds.Addr()), up.proxy())
	headers, reset, settled := resetStreams(t, s)
	const n = 50
	for i := range n {
		reset(uint32(2*i+1), [][2]string{{"x-queue", fmt.Sprintf("made-up-%d", i)}})
	}
	// A last stream on the connection, not reset, in a queue of its own:
	// once it is served, the server has handled every reset before it;
	// once no handler runs, the handlers of the reset streams are done.
	headers(2*n+1, [][2]string{{"x-queue", "last"}})
	// Once the server has answered a ping sent after it, it has read
	// every reset: a reset stream's handler that got ahead of its reset
	// ends (leaves its queue, or its forward is cut), and the one handler
	// left, running at the upstream, is the last stream's.
	settled()
	require.Eventually(t, func() bool { return handlersRunning() == 1 && up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the last stream's request is not the one left at the upstream")
	up.release <- struct{}{}
	require.Eventually(t, func() bool { return up.run.Load() == 0 }, 10*time.Second, 5*time.Millisecond)

	require.Eventually(t, func() bool { return handlersRunning() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the handlers of the reset streams still run")
	// Each queue joined in Redis has its node subscribed to its grants
	// (a shard channel), from its join until the queue is given back.
	channels, err := rds.Client(t).PubSubShardChannels(context.Background(), "*").Result()
	require.NoError(t, err)
	t.Logf("%d grant channels subscribed", len(channels))
	assert.LessOrEqual(t, len(channels), 1+n/5, "queues joined in Redis for streams reset with their body")
	assert.LessOrEqual(t, int(up.total.Load()), len(channels), "a reset stream reached the upstream without joining its queue first")
}

// handlersRunning counts the goroutines in fair_queue's ServeHTTP.
func handlersRunning() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "caddy-fair-queue.(*Handler).ServeHTTP(")
}
