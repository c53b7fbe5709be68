package caddyfairqueue

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// hostileValues are what a client may put in a header that a template
// places outside a JSON string: structure, a string, a second event.
var hostileValues = []string{
	`1,"injected":true`,
	`{"injected":true}`,
	`[1]`,
	`"text"`,
	`abc`,
	``,
	` 1`,
	`01`,
	`1}`,
	"1\n\nevent: forged\ndata: x",
	"1\r\ndata: x",
	`truex`,
}

func TestPlaceholderOutsideAStringIsAJSONNumberOrNull(t *testing.T) {
	cfg := []*RejectConfig{{Body: `{"n":{http.request.header.X-Num},"q":"{http.request.header.X-Num}"}`}}
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, RetryAfter: time.Second}
	for _, v := range []string{"0", "-1", "2.5", "-3.25e+10", "1E5", "true", "false", "null"} {
		w := renderReject(t, cfg, rej, false, map[string]any{"http.request.header.X-Num": v})
		assert.Equal(t, `{"n":`+v+`,"q":"`+v+`"}`, w.Body.String(), "a JSON number or literal is kept as it is")
	}
	for _, v := range hostileValues {
		w := renderReject(t, cfg, rej, false, map[string]any{"http.request.header.X-Num": v})
		var got map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got), "value %q: body must stay valid JSON: %s", v, w.Body)
		assert.Equal(t, map[string]any{"n": nil, "q": v}, got, "value %q: outside a string anything else is null", v)
	}
}

func TestSSEDataPlaceholderOutsideAStringCannotAddStructureOrEvents(t *testing.T) {
	cfg := []*RejectConfig{{SSEEvent: "busy", SSEData: `{"n":{http.request.header.X-Num},"m":"{http.request.header.X-Num}"}`}}
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, RetryAfter: time.Second}
	for _, v := range hostileValues {
		w := renderReject(t, cfg, rej, true, map[string]any{"http.request.header.X-Num": v})
		body := w.Body.String()
		require.True(t, strings.HasPrefix(body, "event: busy\ndata: "), "value %q: %q", v, body)
		require.True(t, strings.HasSuffix(body, "\n\n"), "value %q: %q", v, body)
		data := strings.TrimSuffix(strings.TrimPrefix(body, "event: busy\ndata: "), "\n\n")
		assert.NotContains(t, data, "\n", "value %q: one data line, one event", v)
		assert.NotContains(t, data, "\r", "value %q", v)
		var got map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &got), "value %q: data must stay valid JSON: %q", v, data)
		assert.Equal(t, map[string]any{"n": nil, "m": v}, got, "value %q", v)
	}
}
