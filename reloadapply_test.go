package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The handler that takes over a queue named from the request is the one
// of the newest loaded config that names queues as the cleaned-up one
// did and serves that queue; none where two of that config do.
func TestTheSuccessorOfAQueueNamedFromTheRequestIsTheNewestConfigsOnlyHandler(t *testing.T) {
	const tmpl = "{http.fair_queue.model}"
	load := func() chan struct{} { return make(chan struct{}) }
	handler := func(gen uint64, l chan struct{}, names ...string) *Handler {
		return &Handler{Name: tmpl, gen: gen, load: l, dynamic: true, names: nameSet(names)}
	}
	e := &engine{name: "llama", data: "reg-test"}
	successor := func(hs ...*Handler) *Handler {
		reg := &templateRegistry{m: map[templateKey]map[*Handler]bool{{data: "reg-test", name: tmpl}: {}}}
		for _, h := range hs {
			reg.m[templateKey{data: "reg-test", name: tmpl}][h] = true
		}
		return reg.successor(e, hs[0])
	}
	oldLoad, newLoad, newerLoad := load(), load(), load()
	close(oldLoad)
	old := handler(1, oldLoad)
	a, b := handler(2, newLoad), handler(3, newLoad)
	c := handler(4, newerLoad)

	assert.Same(t, a, successor(old, a), "the one handler of the config in force")
	assert.Nil(t, successor(old, a, b), "two handlers of one config: the request's choice")
	assert.Same(t, c, successor(old, a, b, c), "the newest config's only handler")
	assert.Nil(t, successor(old), "none loaded")
	assert.Nil(t, successor(old, handler(5, newLoad, "mistral")), "one that does not serve the queue")
	assert.Same(t, a, successor(old, a, handler(6, newLoad, "mistral")), "one that does not serve it is no rival")
}
