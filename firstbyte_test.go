package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstByteSamples reads the count and sum of queue's time to first byte.
func firstByteSamples(t *testing.T, queue, upstream string) (uint64, float64) {
	t.Helper()
	initMetrics()
	var m dto.Metric
	require.NoError(t, metrics.firstByte.WithLabelValues(queue, upstream).(interface{ Write(*dto.Metric) error }).Write(&m))
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestTimeToFirstByteCountsFromTheForwardToTheFirstEvent: an upstream
// that thinks 300 ms before its first event, then streams for 2 s more,
// is observed once, at its first event, not at its answer's end.
func TestTimeToFirstByteCountsFromTheForwardToTheFirstEvent(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "first-byte"
	h := provisionLocal(t, newContext(t), &Handler{Name: name, Permits: 1})
	upstream := proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the header alone is not a first byte of the answer
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(w, "data: {\"choices\":[]}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(2 * time.Second)
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	srv := serve(t, h, upstream)
	n0, sum0 := firstByteSamples(t, name, "")

	resp := srv.post(t, context.Background(), `{"stream":true}`)
	_, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "granted", srv.outcome(t))

	n, sum := firstByteSamples(t, name, "")
	require.Equal(t, n0+1, n, "one answer, one observation")
	ttfb := sum - sum0
	assert.GreaterOrEqual(t, ttfb, 0.3, "from the forward to the first event")
	assert.Less(t, ttfb, 2.0, "at the first event, not at the answer's end (2.3 s)")
}
