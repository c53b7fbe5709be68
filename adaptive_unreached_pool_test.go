package caddyfairqueue

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// With a pool, a request granted on an upstream that cannot be reached
// (its dial refused) goes back into the queue and on to another upstream,
// and the unreachable one cools (TestUnreachableUpstreamIsRequeuedElsewhere).
// For an adaptive queue that is no refusal of the upstream's: a replica
// that is down is not an overloaded one, and counted as one, an outage
// would leave its learned share at the floor once it is back, as it would
// the queue's for a stream reverse_proxy never got to the backend
// (TestAdaptiveDoesNotCountAStreamThatNeverReachedTheBackend).
func TestAdaptiveDoesNotCountAnUnreachablePoolUpstreamAsARefusal(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "adapt-pool-unreachable",
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1,
			Interval: caddy.Duration(100 * time.Millisecond), Decrease: 0.5}})
	var dead string
	next := &pooled{answer: func(call int, up string, w http.ResponseWriter) error {
		if call == 1 {
			dead = up
		}
		if up == dead {
			return caddyhttp.Error(http.StatusBadGateway, reverseproxy.NewDialError(errors.New("dial tcp: connection refused")))
		}
		return answerOK(w)
	}}
	req := poolRequest(context.Background()).start(h, next).wait(t)
	require.NoError(t, req.err, "no 502: the request went elsewhere")
	require.Len(t, next.calls, 2, "requeued once")
	q := engineOf(t, h).q
	require.NoError(t, h.Cleanup()) // the queue leaves once every report on its way is answered
	share, learned := q.Shares()[dead]
	assert.False(t, learned, "the unreachable upstream's dial failure counted as its refusal: its share is %v", share)
}
