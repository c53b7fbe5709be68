package caddyfairqueue

import (
	"context"
	"encoding/binary"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/assert"
)

// vLLM and SGLang read a JSON body with Python's json.loads (FastAPI),
// which takes UTF-16 and UTF-32 as well as UTF-8. Such a body waits in
// the queue of the model it names, weighed by its max_tokens, as the
// backend runs it. Before, it was read as no JSON at all: it waited in
// the default queue, escaping its model's permits, weighed by the
// default budget rather than the 100,000 tokens it asked.
func TestAUTF16BodyWaitsInItsModelsQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.fair_queue.model}", Permits: 1, KVTokens: 1 << 20, DefaultMaxTokens: 500})
	var body []byte
	for _, u := range utf16.Encode([]rune(`{"model":"big","max_tokens":100000,"messages":[{"role":"user","content":"abcd"}]}`)) {
		body = binary.LittleEndian.AppendUint16(body, u)
	}
	next := newHolder()
	req := newRequest(context.Background(), string(body)).start(h, next)
	next.waitEntered(t)
	assert.Equal(t, "big", req.placeholder(phQueue))
	assert.Equal(t, int64(1+100000), h.engineList()[0].tokens.Load(), "its prompt's token and its max_tokens")
	next.release <- struct{}{}
	req.wait(t)
	settled(t, h)
}
