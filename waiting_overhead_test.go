package caddyfairqueue

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldMemory is what the process holds in its heap and goroutine
// stacks, after a collection.
func heldMemory() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// What a waiting request holds beyond its body and head (its
// goroutines' stacks, its connection's buffers, Caddy's state of the
// request) counts against max_waiting_bytes: max_queue has no default,
// so that nothing else bounds how many wait. Uncounted, a request of
// `{}` and a short head counted 122 bytes and held 39 KiB, so that the
// default 256 MiB let about two million such waiters in, holding some
// 80 GiB, over connections Caddy does not limit (or streams of a few
// HTTP/2 connections).
func TestAWaitingRequestCountsWhatItHoldsAgainstMaxWaitingBytes(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	name := "waiter-cost"
	url := runCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name), up.proxy())
	running := chat(context.Background(), http.DefaultClient, url, `{}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	// Each waiter is a connection that sent its whole request and reads
	// nothing: what the client side holds of it is a socket.
	const n = 500
	before, counted := heldMemory(), waitingBytes.Load()
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range n {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		require.NoError(t, err)
		conns = append(conns, c)
		_, err = c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"))
		require.NoError(t, err)
	}
	waitQueueWaiting(t, name, n)
	held, counted := heldMemory()-before, waitingBytes.Load()-counted
	t.Logf("each waiter holds %d bytes, counted %d", held/n, counted/n)
	assert.LessOrEqual(t, held, 2*counted, "the waiters hold more than twice what max_waiting_bytes counts of them")

	for _, c := range conns {
		c.Close()
	}
	waitQueueWaiting(t, name, 0)
	up.release <- struct{}{}
	a := got(t, running)
	require.NoError(t, a.err)
	assert.Equal(t, http.StatusOK, a.status)
	require.Eventually(t, func() bool { return waitingBytes.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "bytes left counted")
}
