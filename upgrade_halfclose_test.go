package caddyfairqueue

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An upgraded HTTP/1 connection whose client closes its sending side
// (shutdown(SHUT_WR)) and waits for the rest of the answer: reverse_proxy
// passes that half-close on to the upstream and keeps the other way
// open, so the upstream's answer, written after the client's end, still
// reaches the client. fair_queue's watch for clients that left must not
// take that end for the client's leaving and cut the tunnel.
func TestAnUpgradedConnectionThatTheClientHalfClosesStillAnswersOverHTTP1(t *testing.T) {
	for _, pool := range []bool{false, true} {
		t.Run(fmt.Sprintf("pool=%v", pool), func(t *testing.T) { upgradedHalfClose(t, pool) })
	}
}

func upgradedHalfClose(t *testing.T, pool bool) {
	t.Cleanup(func() { poolEmpty(t) })
	// The upstream reads what the client sends up to its end, thinks a
	// while (the watch looks every 500 ms), then answers and closes.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: lines\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		sent, err := io.ReadAll(brw)
		if err != nil {
			return
		}
		time.Sleep(2 * time.Second)
		_, _ = fmt.Fprintf(brw, "got %d bytes\n", len(sent))
		_ = brw.Flush()
	}))
	t.Cleanup(srv.Close)
	dial := strings.TrimPrefix(srv.URL, "http://")
	name := fmt.Sprintf("upgrade-halfclose-%v", pool)
	handlers := []string{fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s"}`, name),
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, dial)}
	if pool {
		handlers = []string{fmt.Sprintf(`{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1}],"max_wait":"60s"}`, name, dial),
			`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`}
	}
	url := runCaddy(t, handlers...)

	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET /tunnel HTTP/1.1\r\nHost: x\r\nUpgrade: lines\r\nConnection: Upgrade\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	_, err = io.WriteString(conn, "hello\n")
	require.NoError(t, err)
	require.NoError(t, conn.(*net.TCPConn).CloseWrite())

	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "got 6 bytes\n", string(rest), "the upstream's answer after the client's half-close")
}
