package caddyfairqueue

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitersChildEnv names the child process's settings: protocol, count,
// address and whether the requests stream ("h2,300,127.0.0.1:1234,1").
const waitersChildEnv = "FQ_TEST_WAITERS_CHILD"

// TestWaitersChildProcess is the child of measureWaiters: it opens the
// requests and holds them until its stdin closes. It is no test of its
// own.
func TestWaitersChildProcess(t *testing.T) {
	spec := os.Getenv(waitersChildEnv)
	if spec == "" {
		t.Skip("the child process of measureWaiters")
	}
	parts := strings.Split(spec, ",")
	proto, addr, stream := parts[0], parts[2], parts[3] == "1"
	n, _ := strconv.Atoi(parts[1])
	tc := &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"} //nolint:gosec // a test certificate
	body := `{"model":"m"}`
	if stream {
		body = `{"model":"m","stream":true}`
	}
	// A transport per 100 requests: an HTTP/3 connection takes 100
	// streams at once, an HTTP/2 one 250.
	var trs []http.RoundTripper
	for range (n + 99) / 100 {
		tc := tc.Clone() // each transport adds its protocols to its own (ALPN): shared, they race
		switch proto {
		case "h3":
			trs = append(trs, &http3.Transport{TLSClientConfig: tc,
				Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
					return quic.DialAddrEarly(ctx, addr, tc, qc)
				}})
		default:
			tr := &http.Transport{TLSClientConfig: tc, Protocols: new(http.Protocols), MaxConnsPerHost: 0,
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				}}
			if proto == "h2" {
				tr.Protocols.SetHTTP2(true)
			} else {
				tr.Protocols.SetHTTP1(true)
			}
			trs = append(trs, tr)
		}
	}
	for i := range n {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, "https://localhost/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if stream {
				req.Header.Set("Accept", "text/event-stream")
			}
			resp, err := trs[i/100].RoundTrip(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body) // takes what the queue sends while it waits
			}
		}()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, tr := range trs { // a client that leaves, not one that vanishes (QUIC's idle timeout)
		if c, ok := tr.(io.Closer); ok {
			_ = c.Close()
		} else {
			tr.(*http.Transport).CloseIdleConnections()
		}
	}
}

// measureWaiters has a child process wait n requests over proto in the
// queue name of s (whose one permit is held), and returns what the
// waiters hold in this process and what max_waiting_bytes counts of
// them, each per waiter.
func measureWaiters(t *testing.T, s *tlsCaddy, name, proto string, n int, stream bool) (held, counted int64) {
	t.Helper()
	before, countedBefore := heldMemory(), waitingBytes.Load()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWaitersChildProcess$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%s,%d", waitersChildEnv, proto, n, s.addr, map[bool]int{false: 0, true: 1}[stream]))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	var once sync.Once
	end := func() {
		once.Do(func() {
			_ = stdin.Close()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(end)
	require.Eventually(t, func() bool { return queueWaiting(t, name) == n }, 60*time.Second, 10*time.Millisecond,
		"want %d waiting in %s", n, name)
	time.Sleep(500 * time.Millisecond) // a few keepalive comments each
	held, counted = heldMemory()-before, waitingBytes.Load()-countedBefore
	end()
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 60*time.Second, 10*time.Millisecond,
		"the child's requests still wait")
	return held / int64(n), counted / int64(n)
}

func TestWaitersOverEachProtocolHoldAboutWhatTheyCount(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", proto, stream), func(t *testing.T) {
				t.Cleanup(func() { poolEmpty(t) })
				up := newHeldUpstream(t)
				name := fmt.Sprintf("waiters-%s-%v", proto, stream)
				s := runTLSCaddy(t, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"120s","sse_keepalive":"100ms"}`, name), up.proxy())
				running := chat(context.Background(), s.client(t, "h1"), s.url, `{}`)
				require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
				held, counted := measureWaiters(t, s, name, proto, 150, stream)
				t.Logf("%s stream=%v: each waiter holds %d bytes, counted %d", proto, stream, held, counted)
				assert.LessOrEqual(t, held, waiterHeldFactor*counted, "the waiters hold more than %d times what max_waiting_bytes counts of them", waiterHeldFactor)
				up.release <- struct{}{}
				a := got(t, running)
				require.NoError(t, a.err)
			})
		}
	}
}
