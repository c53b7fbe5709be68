package caddyfairqueue

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The exit waits for the requests it ended (engine.endRunning) up to
// their abort grace and a little more. A request that does not end when
// ended (its stream's client reads nothing: reverse_proxy's write to it
// blocks) holds the exit for that long. A reload that dropped the only
// handler with `abort_grace 1m` leaves no request with that grace, so
// the exit waits the grace of the handlers whose requests still run.
// (Before, it waited the longest abort grace any handler of the process
// ever had: every later stop took 1m3s.)
func TestExitAfterAReloadDroppedALongAbortGraceWaitsOnlyTheGraceStillInForce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)

	var arrivals atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrivals.Add(1)
		streamUntilGone(w, r)
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { exitingForTest.Store(false) })

	port := freePort(t)
	config := func(handler string) string {
		return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"grace_period":"300ms","servers":{"s":{"listen":["127.0.0.1:%d"],
		"listener_wrappers":[{"wrapper":"fq_test_shut_window","after":"data: {}"}],
		"routes":[{"handle":[%s,
		{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}]}]}}}}}`,
			port, handler, strings.TrimPrefix(upstream.URL, "http://"))
	}
	// A config whose handler holds an aborted request's permit a minute,
	// then a reload that drops it for one with the default abort grace.
	require.NoError(t, caddy.Load([]byte(config(fmt.Sprintf(
		`{"handler":"fair_queue","name":"long","permits":1,"abort_grace":"1m","redis":{"addresses":[%q]}}`,
		rds.Addr()))), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	require.NoError(t, caddy.Load([]byte(config(fmt.Sprintf(
		`{"handler":"fair_queue","name":"a","permits":1,"max_wait":"60s","redis":{"addresses":[%q]}}`,
		rds.Addr()))), false))

	// A stream whose client reads nothing after its first event.
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	body := `{"stream":true,"messages":[]}`
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the stream reaches the upstream")
	time.Sleep(200 * time.Millisecond) // its writes to the client block

	exitingForTest.Store(true) // the process exits (SIGTERM, caddy stop)
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- caddy.Stop() }()
	select {
	case <-stopped:
		// grace_period 300ms, the default abort grace 50ms and the 3s
		// slack: far below the minute of the dropped handler.
		assert.Less(t, time.Since(start), 30*time.Second)
	case <-time.After(45 * time.Second):
		t.Fatal("caddy.Stop still waits 45s after the exit began, for a request whose abort grace is 50ms " +
			"(the abort grace of 1m belonged to a handler a reload dropped)")
	}
}
