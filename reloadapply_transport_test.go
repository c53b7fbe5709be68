package caddyfairqueue

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What follows fair_queue is read from the loaded config, where Caddy
// drops the raw config of a module once it has loaded it: two
// reverse_proxy handlers with the same upstreams and another transport
// look alike. A transport may send the same upstream address elsewhere
// (its own DNS resolvers): such a reload must not hand on more permits
// that the old config's waiters then run on the old upstream.

// answerA serves DNS on a UDP port of 127.0.0.1, answering every query
// for an IPv4 address with ip (and every other with none); it returns
// the port's address.
func answerA(t *testing.T, ip net.IP) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := dnsAnswer(buf[:n], ip); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}

// dnsAnswer is the answer to query q: ip for a question of type A, no
// record for another; nil if q is not a query of one question.
func dnsAnswer(q []byte, ip net.IP) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil
	}
	end := 12
	for end < len(q) && q[end] != 0 {
		end += int(q[end]) + 1
	}
	end += 5 // the root label, the type and the class
	if end > len(q) {
		return nil
	}
	resp := append([]byte{q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0}, q[12:end]...)
	if binary.BigEndian.Uint16(q[end-4:end-2]) == 1 {
		resp[7] = 1
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4)
		resp = append(resp, ip.To4()...)
	}
	return resp
}

// peakUpstreamAt is a peakUpstream listening on addr.
func peakUpstreamAt(t *testing.T, addr string) *peakUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	g := newPeakUpstream(t)
	handler := g.srv.Config.Handler
	g.srv.Close()
	g.srv = httptest.NewUnstartedServer(handler)
	_ = g.srv.Listener.Close()
	g.srv.Listener = ln
	g.srv.Start()
	t.Cleanup(g.srv.Close)
	return g
}

// resolvedConfig is a config whose fair_queue handler of queue "older",
// permits, goes to llm.test on port through resolver dns.
func resolvedConfig(port, permits, upstreamPort int, dns string) string {
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"older","permits":%d,"max_wait":"1m"},
		{"handler":"reverse_proxy","upstreams":[{"dial":"llm.test:%d"}],
			"transport":{"protocol":"http","resolver":{"addresses":[%q]}}}]}]}}}}}`, port, permits, upstreamPort, dns)
}

// The reload keeps the upstream's address, raises the permits from 1
// to 3, and resolves the address elsewhere (A to B): the old config's
// waiters, on their own route, still reach A, which must not run three
// of them.
func TestHandingOnMorePermitsTellsTransportsApart(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a := newPeakUpstream(t)
	_, p, err := net.SplitHostPort(a.dial())
	require.NoError(t, err)
	upstreamPort, err := strconv.Atoi(p)
	require.NoError(t, err)
	b := peakUpstreamAt(t, net.JoinHostPort("127.0.0.2", p))
	toA, toB := answerA(t, net.IPv4(127, 0, 0, 1)), answerA(t, net.IPv4(127, 0, 0, 2))

	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(resolvedConfig(port, 1, upstreamPort, toA)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	codes := sendOlder(t, port, "/", 4)
	require.Eventually(t, func() bool { return a.now.Load() == 1 && olderWaiting() == 3 }, 10*time.Second,
		5*time.Millisecond, "one request on A, three waiting")

	require.NoError(t, caddy.Load([]byte(resolvedConfig(port, 3, upstreamPort, toB)), false))
	time.Sleep(500 * time.Millisecond) // time for waiters granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than its 1 permit")

	a.open()
	b.open()
	for range 4 {
		assert.Equal(t, http.StatusOK, <-codes)
	}
}
