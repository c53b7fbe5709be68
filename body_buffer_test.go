package caddyfairqueue

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bodiesBeingRead is the number of request bodies fair_queue is reading
// and waiting for more bytes of.
func bodiesBeingRead() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "caddy-fair-queue.readGrowing(") && strings.Contains(g, ".Wait(") {
			n++
		}
	}
	return n
}

// stalledUploads opens an HTTP/2 connection to s and starts n
// requests on it, each declaring a body of declared bytes and sending
// its first 12 (frames written by hand: the client holds nothing per
// request); closing the connection ends them.
func stalledUploads(t *testing.T, s *tlsCaddy, n int, declared int64) net.Conn {
	t.Helper()
	conn, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.roots, ServerName: "localhost", NextProtos: []string{"h2"}})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = io.WriteString(conn, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	var mu sync.Mutex // the framer's writes
	require.NoError(t, fr.WriteSettings())
	go func() { // read, and acknowledge the server's settings
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				mu.Lock()
				_ = fr.WriteSettingsAck()
				mu.Unlock()
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range n {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "localhost"},
			{":path", "/v1/chat/completions"}, {"content-length", strconv.FormatInt(declared, 10)}} {
			require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
		}
		id := uint32(2*i + 1)
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		if err == nil {
			err = fr.WriteData(id, false, []byte(`{"model":"m"`))
		}
		mu.Unlock()
		require.NoError(t, err)
	}
	return conn
}

// A body being read costs what has arrived, not what the client
// declared: many HTTP/2 streams on one connection, each declaring a
// large body and sending 12 bytes, hold no more than streams that
// declared those 12 bytes and one more (but for the HTTP/2 server's own
// buffer, up to 16 KiB). fair_queue's buffer used to start at 64 KiB
// whatever had arrived, so that each stream held 72 KiB more for its 12
// bytes (a client opening 250 streams on each of its connections: 18
// MiB a connection for 3 KiB sent).
func TestAStalledUploadHoldsWhatArrivedNotABufferOverHTTP2(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	s := runTLSCaddy(t, `{"handler":"fair_queue","name":"stalled","permits":1,"max_body":8388608,"body_timeout":"60s"}`, up.proxy())
	const n = 200
	held := func(declared int64) int64 {
		before := heldMemory()
		conn := stalledUploads(t, s, n, declared)
		require.Eventually(t, func() bool { return bodiesBeingRead() == n }, 20*time.Second, 10*time.Millisecond,
			"want %d bodies being read, %d are", n, bodiesBeingRead())
		grew := heldMemory() - before
		conn.Close()
		require.Eventually(t, func() bool { return bodiesBeingRead() == 0 }, 20*time.Second, 10*time.Millisecond)
		return grew
	}
	small := held(13)
	large := held(1 << 20)
	t.Logf("each stream: %d bytes declaring 13, %d declaring 1 MiB", small/n, large/n)
	assert.Less(t, (large-small)/n, int64(32<<10),
		fmt.Sprintf("a stream declaring 1 MiB and sending 12 bytes holds %d bytes more than one declaring 13", (large-small)/n))
	assert.Zero(t, up.total.Load(), "a stalled upload reached the upstream")
}
