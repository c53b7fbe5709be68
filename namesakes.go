package caddyfairqueue

import (
	"slices"
	"sync"
)

// A reload that moves a queue to another store (the local store to
// Redis, another Redis, another key prefix or db) leaves two queues of
// one name on this node for a while: the old config's, retired, with the
// requests of the old config still running and waiting in the old store,
// and the new config's in the new store. Neither store sees the other's
// requests, and together they would run up to twice the permits. So each
// counts the other's running requests against its permits (the retired
// queue those of the live one, and the live queue those of the retired
// one): a grant in either needs room in both, the old config's waiters
// are served in the old queue as its requests end, ahead of the new
// config's, and the new queue has its whole permits once the old one is
// gone. Two live queues of one name in different stores (two sites of
// one config) are apart by the operator's choice and do not count each
// other. The count is this node's: in a cluster that changes store,
// each instance counts its own old requests.

// namesakes are the engines of this process by queue name.
var namesakes = engineRegistry{byName: make(map[string][]*engine)}

type engineRegistry struct {
	mu     sync.Mutex
	byName map[string][]*engine
}

func (r *engineRegistry) add(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byName[e.name] = append(r.byName[e.name], e)
}

func (r *engineRegistry) remove(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rest := slices.DeleteFunc(r.byName[e.name], func(o *engine) bool { return o == e })
	if len(rest) == 0 {
		delete(r.byName, e.name)
		return
	}
	r.byName[e.name] = rest
}

// reserved is fairqueue.Config.Reserved of e's queue: the requests
// running in e's namesakes in other stores of the other side of a
// reload (see above).
func (e *engine) reserved() int {
	namesakes.mu.Lock()
	defer namesakes.mu.Unlock()
	n := 0
	for _, o := range namesakes.byName[e.name] {
		if o.data != e.data && o.retiredFlag.Load() != e.retiredFlag.Load() {
			n += int(o.running.Load())
		}
	}
	return n
}
