package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// vLLM and SGLang (FastAPI) parse a body with Python's json.loads, which
// takes a UTF-8 byte order mark before the JSON: the request runs as
// if it were not there. The weight reads such a body as they do,
// rather than as one it cannot read (all its bytes, the default budget,
// one completion).
func TestWeightReadsABodyAfterAByteOrderMark(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-bom", KVTokens: 100000, DefaultMaxTokens: 500})
	body := "\xef\xbb\xbf" + `{"model":"m","n":8,"max_tokens":100,"messages":[{"role":"user","content":"abcd"}]}`
	next := newHolder()
	req := newRequest(context.Background(), body).start(h, next)
	next.waitEntered(t)
	assert.Equal(t, int64(1+8*100), h.engineList()[0].tokens.Load())
	assert.Equal(t, "m", req.placeholder(phModel))
	next.release <- struct{}{}
	req.wait(t)
	settled(t, h)
}
