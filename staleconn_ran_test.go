package caddyfairqueue

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crashingUpstream is a Go HTTP upstream (HTTP/1.1 and h2c) whose
// handler runs a request marked X-Crash, reads its body, and then dies
// before answering anything (http.ErrAbortHandler: an HTTP/1 connection
// is closed, an HTTP/2 stream reset), as a worker killed mid-request
// does; it serves every other request after a short while, so that
// concurrent ones open connections of their own, kept alive after.
type crashingUpstream struct {
	ln  net.Listener
	ran atomic.Int64 // X-Crash requests read
}

func newCrashingUpstream(t *testing.T) *crashingUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &crashingUpstream{ln: ln}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Crash") != "" {
			u.ran.Add(1)
			panic(http.ErrAbortHandler)
		}
		time.Sleep(200 * time.Millisecond)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}), Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return u
}

// crashRun loads a pool of u alone (transport: reverse_proxy's transport
// JSON, "" for its default), warms kept-alive connections to it with
// concurrent requests, and sends one X-Crash POST: its status, and
// whether the upstream cooled for it.
func crashRun(t *testing.T, u *crashingUpstream, name, transport string) (status int, cooled bool) {
	t.Helper()
	port := freePort(t)
	dial := u.ln.Addr().String()
	require.NoError(t, caddy.Load([]byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":4}],"max_wait":"20s"},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}%s}]}]}}}}}`,
		port, name, dial, transport)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			resp, err := http.Post(url, "application/json", strings.NewReader(`{}`))
			if assert.NoError(t, err) {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	c := metrics.cooldowns.WithLabelValues(name, dial)
	c0 := testutil.ToFloat64(c)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err)
	req.Header.Set("X-Crash", "1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, testutil.ToFloat64(c) > c0
}

// An HTTP/1 upstream that read a request on a kept-alive connection and
// then died before answering (a worker killed mid-generation, a handler
// that panicked) looks like one that had dropped the connection idle.
// The request was sent again on each of the pool's other kept-alive
// connections, run by the upstream up to max_requeues + 1 times, and the
// upstream never cooled, its listener still up. It is sent again once at
// most: a second such drop is the upstream's failure (502, it cools).
func TestAStaleConnectionSendsARequestAgainOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	u := newCrashingUpstream(t)
	status, cooled := crashRun(t, u, "stale-ran-h1", "")
	assert.Equal(t, http.StatusBadGateway, status)
	assert.LessOrEqual(t, u.ran.Load(), int64(2), "the upstream ran the request more than twice")
	assert.True(t, cooled, "the upstream that failed the request again did not cool")
}

// Over HTTP/2 an upstream closes an idle connection with a GOAWAY, whose
// unprocessed streams Go's transport sends again itself: a stream the
// upstream reset on a shared connection is one it read, and maybe ran.
// It was taken for a stale connection (reused, nothing answered): sent
// again up to max_requeues times, the upstream never cooled. It is the
// upstream's failure: 502, not sent again, the upstream cooling.
func TestAnHTTP2StreamResetIsNoStaleConnection(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	u := newCrashingUpstream(t)
	status, cooled := crashRun(t, u, "stale-ran-h2c", `,"transport":{"protocol":"http","versions":["h2c"]}`)
	assert.Equal(t, http.StatusBadGateway, status)
	assert.Equal(t, int64(1), u.ran.Load(), "the upstream ran the request more than once")
	assert.True(t, cooled, "the upstream that failed the request did not cool")
}
