package caddyfairqueue

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lateEOF is a handler module for tests, placed between fair_queue and
// reverse_proxy: the request body it passes on (in place) reports its
// end 300 ms late, as a transport's writer does when the scheduler
// runs it after the upstream answered.
type lateEOF struct{}

func init() { caddy.RegisterModule(lateEOF{}) }

// CaddyModule returns the Caddy module information.
func (lateEOF) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue_test_late_eof",
		New: func() caddy.Module { return new(lateEOF) },
	}
}

// ServeHTTP passes r on with a body whose end comes late.
func (lateEOF) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Body != nil {
		r.Body = &lateEOFBody{ReadCloser: r.Body}
	}
	return next.ServeHTTP(w, r)
}

// lateEOFBody waits 300 ms before it reports the end of its body.
type lateEOFBody struct{ io.ReadCloser }

func (b *lateEOFBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		time.Sleep(300 * time.Millisecond)
	}
	return n, err
}

// A request refused by its upstream is requeued while the transport may
// still be writing its body to that upstream: an upstream answers once
// it has the body's bytes, before the transport's writer has read the
// body's end, at which reverse_proxy copies the trailers of the request
// fair_queue passed on. The requeue resets that request for its next
// sending without writing what that writer reads: under -race (as CI
// runs), the reset and the writer's read are a data race otherwise. The
// body is larger than the transport's buffer, so that its bytes reach
// the upstream before the writer reads the end.
func TestARequeueDoesNotRaceTheRefusedSendingsBodyWriter(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			http.Error(w, `{"error":"busy"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"answer":"ok"}`)
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-late-eof","upstreams":[{"dial":%q,"permits":1}],
			"requeue_on":[503],"upstream_cooldown":"10ms"}`, strings.TrimPrefix(up.URL, "http://")),
		`{"handler":"fair_queue_test_late_eof"}`,
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)

	prompt := strings.Repeat("x", 64<<10)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+prompt+`"}]}`))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `{"answer":"ok"}`, string(body), "the answer of the second sending")
	assert.Equal(t, int32(2), calls.Load(), "sent again after the refusal")
}
