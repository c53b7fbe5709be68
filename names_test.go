package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestCaddyfileNamesAddUpAcrossLines(t *testing.T) {
	h, err := parse("fair_queue {\nname {http.fair_queue.model}\nnames a b\nnames c\npermits 1\n}")
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, h.Names)
}

// With names, a name a client makes up is answered 404 model_not_found
// at once, opens no queue (no engine, no Redis key, no metric label of
// its own) and so can never keep a listed name out, even after more
// made-up names than the queue cap.
func TestUnlistedNameIsAnswered404WithoutOpeningAQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	reg := prometheus.NewRegistry()
	registerMetrics(reg)
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{
		Name: "{http.fair_queue.model}", Names: []string{"served"}, Permits: 1,
	})
	for i := range maxQueuesPerHandler + 5 {
		for _, body := range []string{`{"model":"madeup-` + strconv.Itoa(i) + `"}`, `{"model":"madeup","stream":true}`} {
			req := newRequest(context.Background(), body).start(h, okHandler).wait(t)
			require.Equal(t, http.StatusNotFound, req.w.Code, body)
			require.Equal(t, outcomeUnknownName, req.placeholder(phOutcome))
			var answer apiError
			require.NoError(t, json.Unmarshal(req.w.Body.Bytes(), &answer), req.w.Body.String())
			require.Equal(t, "model_not_found", answer.Error.Code)
		}
	}
	assert.Empty(t, h.engineList(), "an unlisted name opened a queue")
	assert.Empty(t, rds.Keys(t, "*"), "an unlisted name reached Redis")

	served := model(t, h, "served")
	assert.Equal(t, http.StatusOK, served.w.Code)
	assert.Equal(t, "granted", served.placeholder(phOutcome))

	families, err := reg.Gather()
	require.NoError(t, err)
	labels := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" {
					labels[l.GetValue()] = true
					assert.NotContains(t, l.GetValue(), "madeup", "a made-up name reached a metric label")
				}
			}
		}
	}
	assert.True(t, labels[unknownQueue], "the unlisted names are counted under %s: %v", unknownQueue, labels)
}
