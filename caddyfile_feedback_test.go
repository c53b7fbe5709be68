package caddyfairqueue

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCaddyfileParsesWaitingFeedbackAndRejectStream(t *testing.T) {
	h, err := parse(`fair_queue {
		permits 2
		max_wait 30s
		sse_keepalive 15s
		sse_queue_events
		redis redis://127.0.0.1:6379
		reject_stream llm:rejects {
			maxlen 5000
			field conversation {http.request.header.X-Conversation-Id}
			field model {http.fair_queue.model}
		}
	}`)
	require.NoError(t, err)
	assert.Equal(t, caddy.Duration(15*time.Second), h.SSEKeepalive)
	assert.True(t, h.SSEQueueEvents)
	assert.Equal(t, &RejectStreamConfig{Key: "llm:rejects", MaxLen: 5000, Fields: map[string]string{
		"conversation": "{http.request.header.X-Conversation-Id}",
		"model":        "{http.fair_queue.model}",
	}}, h.RejectStream)

	h, err = parse("fair_queue {\npermits 1\nredis\nreject_stream busy\n}")
	require.NoError(t, err)
	assert.Equal(t, &RejectStreamConfig{Key: "busy"}, h.RejectStream, "the block is optional; maxlen defaults at provision")
	assert.Zero(t, h.SSEKeepalive, "off by default")
}

func TestCaddyfileRefusesBadWaitingFeedbackAndRejectStream(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"keepalive without interval", "sse_keepalive", "wrong argument count"},
		{"keepalive too short", "sse_keepalive 10ms", "sse_keepalive must be at least 100ms, got 10ms"},
		{"keepalive not a duration", "sse_keepalive often", "sse_keepalive: invalid duration 'often'"},
		{"keepalive not shorter than max wait", "max_wait 10s\nsse_keepalive 10s", "sse_keepalive (10s) must be shorter than max_wait (10s)"},
		{"keepalive beyond default max wait", "sse_keepalive 30s", "sse_keepalive (30s) must be shorter than max_wait (20s)"},
		{"keepalive twice", "sse_keepalive 1s\nsse_keepalive 2s", "subdirective 'sse_keepalive' is given twice"},
		{"queue events with argument", "sse_keepalive 1s\nsse_queue_events yes", "wrong argument count"},
		{"queue events without keepalive", "sse_queue_events", "sse_queue_events requires sse_keepalive"},

		{"reject stream without redis", "reject_stream busy", "reject_stream requires a redis block"},
		{"reject stream without key", "redis\nreject_stream", "wrong argument count"},
		{"reject stream with two keys", "redis\nreject_stream a b", "wrong argument count"},
		{"reject stream twice", "redis\nreject_stream a\nreject_stream b", "subdirective 'reject_stream' is given twice"},
		{"maxlen zero", "redis\nreject_stream a {\nmaxlen 0\n}", "maxlen must be at least 1, got 0"},
		{"maxlen not a number", "redis\nreject_stream a {\nmaxlen lots\n}", "maxlen: 'lots' is not an integer"},
		{"field without template", "redis\nreject_stream a {\nfield conversation\n}", "wrong argument count"},
		{"field twice", "redis\nreject_stream a {\nfield c x\nfield c y\n}", "reject_stream: field 'c' is given twice"},
		{"built-in field", "redis\nreject_stream a {\nfield reason x\n}", "reject_stream: field 'reason' is built in"},
		{"unknown reject stream option", "redis\nreject_stream a {\nttl 1h\n}", "unrecognized subdirective 'ttl'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\npermits 1\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
		})
	}
}

func TestProvisionChecksWaitingFeedback(t *testing.T) {
	for _, tc := range []struct {
		h       *Handler
		wantErr string
	}{
		{&Handler{Permits: 1, SSEKeepalive: caddy.Duration(time.Millisecond)}, "sse_keepalive must be at least 100ms"},
		{&Handler{Permits: 1, SSEKeepalive: caddy.Duration(20 * time.Second)}, "sse_keepalive (20s) must be shorter than max_wait (20s)"},
		{&Handler{Permits: 1, SSEQueueEvents: true}, "sse_queue_events requires sse_keepalive"},
	} {
		err := tc.h.Provision(newContext(t))
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.wantErr)
	}
}
