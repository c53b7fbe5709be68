package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request of a Redis queue is forwarded with a context the exit may
// end (cuttable); when the request is done, fair_queue unhooks it from
// the exit. The transport's writer may still be reading the request's
// body then: the upstream answered once it had the body's bytes, and
// reverse_proxy copies the trailers of the request fair_queue passed on
// when that writer reads the body's end. The end of the request must
// not write what that writer reads: under -race (as CI runs), the two
// were a data race when it gave the request its own context back by
// rewriting the request.
func TestTheEndOfARedisQueuesRequestDoesNotRaceItsBodyWriter(t *testing.T) {
	rds := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"answer":"ok"}`)
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"cut-late-eof","permits":1,"redis":{"addresses":[%q]}}`, rds.Addr()),
		`{"handler":"fair_queue_test_late_eof"}`,
		fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, strings.TrimPrefix(up.URL, "http://")))

	prompt := strings.Repeat("x", 64<<10)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+prompt+`"}]}`))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `{"answer":"ok"}`, string(body))
}
