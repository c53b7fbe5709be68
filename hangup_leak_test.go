package caddyfairqueue

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many HTTP/1 requests through one queue, served, left while waiting,
// left while running and left by a pipelined byte and a close: once
// they are all done, no watch of a client's connection runs on (each
// stopped, its count given back) and the goroutines are back to what
// they were (fair_queue's).
func TestHangupWatchesEndWithTheirRequests(t *testing.T) {
	if !canSeeHangup {
		t.Skip("no watch here")
	}
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	name := "hangup-leak"
	url := runCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":2,"max_wait":"60s"}`, name), up.proxy())
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	warm := chat(context.Background(), client, url, `{"model":"warm"}`)
	up.release <- struct{}{}
	require.Equal(t, http.StatusOK, got(t, warm).status)
	client.CloseIdleConnections()
	require.Eventually(t, func() bool { return hangups.count.Load() == 0 }, 10*time.Second, 10*time.Millisecond)
	base := queueGoroutines()

	const rounds = 5
	for range rounds {
		// Two run, the rest wait: two of those leave, one by a pipelined
		// byte and a close.
		ctx, cancel := context.WithCancel(context.Background())
		var served []<-chan answer
		for i := range 2 {
			served = append(served, chat(context.Background(), client, url, fmt.Sprintf(`{"model":"run%d"}`, i)))
		}
		require.Eventually(t, func() bool { return up.run.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
		leaving := chat(ctx, client, url, `{"model":"leaves"}`)
		conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		require.NoError(t, err)
		body := `{"model":"pipelines"}`
		_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		for i := range 2 {
			served = append(served, chat(context.Background(), client, url, fmt.Sprintf(`{"model":"wait%d"}`, i)))
		}
		waitQueueWaiting(t, name, 4)
		cancel()
		_, err = conn.Write([]byte("P"))
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, conn.Close())
		require.Error(t, got(t, leaving).err)
		require.Eventually(t, func() bool { return queueWaiting(t, name) == 2 }, 10*time.Second, 5*time.Millisecond)
		var wg sync.WaitGroup
		wg.Go(func() {
			for range served {
				up.release <- struct{}{}
			}
		})
		for _, a := range served {
			assert.Equal(t, http.StatusOK, got(t, a).status)
		}
		wg.Wait()
	}
	client.CloseIdleConnections()
	require.Eventually(t, func() bool { return hangups.count.Load() == 0 }, 10*time.Second, 10*time.Millisecond,
		"watches still counted after every request ended")
	require.Eventually(t, func() bool { return queueGoroutines() <= base }, 20*time.Second, 50*time.Millisecond,
		"goroutines of fair_queue left after the requests ended")
}

// queueGoroutines counts the goroutines running fair_queue's code (its
// engine's loops, a request's handler): not the connections kept alive
// to the upstream and from the client, whose number varies.
func queueGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "caddy-fair-queue.") && !strings.Contains(g, "_test.go") {
			n++
		}
	}
	return n
}
