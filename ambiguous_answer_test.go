package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The 400 ambiguous_model answer is OpenAI's JSON error object, also to a
// request that asked for a stream (an error status's body is read as
// JSON), with no Fair-Queue-Reason: it is no reject of the queue's.
func TestTheAmbiguousModelAnswerIsAJSONError(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.fair_queue.model}", Permits: 1})
	for _, body := range []string{
		`{"model":"small","MODEL":"big","messages":[]}`,
		`{"model":"small","MODEL":"big","messages":[],"stream":true}`,
	} {
		t.Run(body, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), body, "Accept", "text/event-stream").start(h, next)
			select {
			case <-req.done:
			case <-next.entered:
				t.Fatal("served")
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
			}
			require.Equal(t, http.StatusBadRequest, req.w.Code)
			assert.Equal(t, "application/json", req.w.Header().Get("Content-Type"))
			assert.Empty(t, req.w.Header().Get("Fair-Queue-Reason"))
			assert.JSONEq(t, `{"error":{"message":"The request body names its model more than once, in different spellings of \"model\".",`+
				`"type":"invalid_request_error","code":"ambiguous_model"}}`, req.w.Body.String())
		})
	}
}
