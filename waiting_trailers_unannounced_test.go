package caddyfairqueue

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/qpack"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// h3Frame is an HTTP/3 frame of type typ (0: DATA, 1: HEADERS).
func h3Frame(typ uint64, payload []byte) []byte {
	b := quicvarint.Append(nil, typ)
	b = quicvarint.Append(b, uint64(len(payload)))
	return append(b, payload...)
}

// qpackBlock is fields encoded as a QPACK field section (no dynamic
// table).
func qpackBlock(t *testing.T, fields ...qpack.HeaderField) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := qpack.NewEncoder(&buf)
	for _, f := range fields {
		require.NoError(t, enc.WriteField(f))
	}
	require.NoError(t, enc.Close())
	return buf.Bytes()
}

// h3UnannouncedTrailers sends to s, over an HTTP/3 connection of its
// own (frames written by hand), a chat request whose body is followed
// by about size bytes of trailer fields that its header did not
// announce (no Trailer field: Go's HTTP/3 client always announces
// them). Closing the returned connection ends the request.
func h3UnannouncedTrailers(t *testing.T, s *tlsCaddy, size int) *quic.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, s.addr, &tls.Config{RootCAs: s.roots, ServerName: "localhost", NextProtos: []string{"h3"}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseWithError(0, "") })
	ctrl, err := conn.OpenUniStream()
	require.NoError(t, err)
	_, err = ctrl.Write(append([]byte{0x00}, h3Frame(0x04, nil)...)) // control stream, empty SETTINGS
	require.NoError(t, err)
	str, err := conn.OpenStreamSync(ctx)
	require.NoError(t, err)
	body := `{"model":"m"}`
	var req []byte
	req = append(req, h3Frame(0x01, qpackBlock(t,
		qpack.HeaderField{Name: ":method", Value: "POST"},
		qpack.HeaderField{Name: ":scheme", Value: "https"},
		qpack.HeaderField{Name: ":authority", Value: "localhost"},
		qpack.HeaderField{Name: ":path", Value: "/v1/chat/completions"},
		qpack.HeaderField{Name: "content-type", Value: "application/json"},
		qpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))},
	))...)
	req = append(req, h3Frame(0x00, []byte(body))...)
	pad := strings.Repeat("t", 4096)
	var trailers []qpack.HeaderField
	for i := range size / len(pad) {
		trailers = append(trailers, qpack.HeaderField{Name: fmt.Sprintf("x-pad-%d", i), Value: pad})
	}
	req = append(req, h3Frame(0x01, qpackBlock(t, trailers...))...)
	_, err = str.Write(req)
	require.NoError(t, err)
	require.NoError(t, str.Close())
	return conn
}

// Over HTTP/3 a client may send trailer fields it did not announce in
// a Trailer header: the server keeps them (up to max_header_bytes) on
// its own copy of the request while the request waits, and the
// handler's copy shows none of them. Such a request counts against
// max_waiting_bytes as one that announced them, at max_header_bytes.
// Before, it was counted as if it had no trailers (a 64 KiB of them
// counted nothing), and the count left by a client that went away
// must still return to zero.
func TestUnannouncedTrailersCountAgainstMaxWaitingBytesOverHTTP3(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	name := "trailers-unannounced"
	s := runTLSCaddyWith(t, `"max_header_bytes":1048576,`, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_body":1000,"max_waiting_bytes":100000,"max_wait":"30s"}`, name), up.proxy())
	running := chat(context.Background(), s.client(t, "h2"), s.url, `{"model":"m"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	conn := h3UnannouncedTrailers(t, s, 64<<10)
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 1 }, 10*time.Second, 5*time.Millisecond, "a is not waiting")
	assert.GreaterOrEqual(t, waitingBytes.Load(), int64(waiterCost+1<<20), "a's unannounced trailers are not counted")

	// a's client goes away: its count is given back.
	require.NoError(t, conn.CloseWithError(0, ""))
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 10*time.Second, 5*time.Millisecond, "a still waits")
	require.Eventually(t, func() bool { return waitingBytes.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "bytes left counted")

	up.release <- struct{}{}
	ans := got(t, running)
	require.NoError(t, ans.err)
	assert.Equal(t, 200, ans.status, ans.body)
}

// lateTrailers is a request body that, as it ends, adds to its
// request's trailers fields of about size bytes in all: Go's client
// sends them, though its Trailer header announced only the fields set
// before the request was sent.
type lateTrailers struct {
	body    io.Reader
	trailer http.Header
	size    int
}

func (l *lateTrailers) Read(p []byte) (int, error) {
	n, err := l.body.Read(p)
	if err == io.EOF {
		pad := strings.Repeat("t", 4096)
		for i := range l.size / len(pad) {
			l.trailer.Set(fmt.Sprintf("X-Pad-%d", i), pad)
		}
	}
	return n, err
}

// Over HTTP/2 a client that announces one trailer field may send
// others: Go's server keeps them all (up to max_header_bytes) while the
// request runs, and shows the handler only those announced. A request
// that announces trailers is counted as one that may send
// max_header_bytes of them. Before, one that announced a field and sent
// 64 KiB of others counted none of them.
func TestUnannouncedTrailersCountAgainstMaxWaitingBytesOverHTTP2(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	name := "trailers-unannounced-h2"
	s := runTLSCaddyWith(t, `"max_header_bytes":1048576,`, fmt.Sprintf(`{"handler":"fair_queue","name":%q,"permits":1,"max_body":1000,"max_waiting_bytes":100000,"max_wait":"30s"}`, name), up.proxy())
	c, closeConns := s.closableClient(t, "h2")
	running := chat(context.Background(), s.client(t, "h2"), s.url, `{"model":"m"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	req, err := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", nil)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Trailer = http.Header{"X-A": nil}
	req.Body = io.NopCloser(&lateTrailers{body: strings.NewReader(`{"model":"m"}`), trailer: req.Trailer, size: 64 << 10})
	req.ContentLength = -1
	done := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 1 }, 10*time.Second, 5*time.Millisecond, "a is not waiting")
	assert.GreaterOrEqual(t, waitingBytes.Load(), int64(waiterCost+64<<10), "a's unannounced trailers are not counted")

	// a's client goes away: its count is given back.
	closeConns()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a's request did not end with its connection")
	}
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 10*time.Second, 5*time.Millisecond, "a still waits")
	require.Eventually(t, func() bool { return waitingBytes.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "bytes left counted")

	up.release <- struct{}{}
	ans := got(t, running)
	require.NoError(t, ans.err)
	assert.Equal(t, http.StatusOK, ans.status, ans.body)
}
