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

// A request over HTTP/1.1 whose Content-Length and Transfer-Encoding
// disagree (the framing of request smuggling) is read by Go's server by
// its chunks, and reaches the upstream framed one way only: a
// Content-Length of the body read, no Transfer-Encoding, so that the
// upstream cannot read it otherwise than the queue weighed it.
func TestARequestFramedTwoWaysReachesTheUpstreamFramedOneWay(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	type seen struct {
		length int64
		te     []string
		header string
		body   string
	}
	got := make(chan seen, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.ContentLength, r.TransferEncoding, strings.Join(r.Header.Values("Content-Length"), ","), string(b)}
	}))
	t.Cleanup(upstream.Close)
	url := runCaddy(t, `{"handler":"fair_queue","name":"framing","permits":1}`,
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(upstream.URL, "http://")))
	body := `{"model":"m"}`
	chunks := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	served := 0
	for _, head := range []string{
		"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
		"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
		"Content-Length: 3\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n%s\r\n%s", head, chunks)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		c.Close()
		if resp.StatusCode == http.StatusBadRequest {
			t.Logf("head %q: refused as malformed", head)
			continue // nothing reached the upstream
		}
		served++
		require.Equal(t, http.StatusOK, resp.StatusCode, "head %q", head)
		s := <-got
		assert.Equal(t, seen{int64(len(body)), nil, fmt.Sprint(len(body)), body}, s, "what the upstream read of head %q", head)
	}
	assert.Positive(t, served, "every such request was refused: nothing was checked")
}
