package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Python's json.loads, which vLLM and SGLang (FastAPI) parse a body
// with, takes NaN, Infinity and -Infinity as numbers: a body holding one
// runs as any other. The weight reads such a body as they do, rather
// than as one it cannot read (all its bytes, the default budget, one
// completion).
func TestWeightReadsABodyWithPythonsNaNAndInfinity(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-python-json", KVTokens: 100000, DefaultMaxTokens: 500})
	for _, extra := range []string{`NaN`, `Infinity`, `-Infinity`, `[NaN,{"y":-Infinity}]`} {
		t.Run(extra, func(t *testing.T) {
			body := `{"model":"m","n":8,"max_tokens":100,"x":` + extra + `,"messages":[{"role":"user","content":"abcd"}]}`
			next := newHolder()
			req := newRequest(context.Background(), body).start(h, next)
			next.waitEntered(t)
			assert.Equal(t, int64(1+8*100), h.engineList()[0].tokens.Load())
			assert.Equal(t, "m", req.placeholder(phModel))
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
