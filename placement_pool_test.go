package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// poolMismatchMsg is the start of the warning for a pool whose
// reverse_proxy picks its own upstreams.
const poolMismatchMsg = "fair_queue has upstream lines, but the reverse_proxy after it does not take the granted upstream"

// A pool's grant names an upstream; only `dynamic fair_queue` sends the
// request there. A reverse_proxy with upstreams of its own (the pool's
// addresses copied into it, the newcomer's first try) balances on its
// own, so no replica is held to its permits and a requeue cools the
// wrong one, and Caddy says the config is valid: it is logged at load.
func TestPoolWhoseReverseProxyPicksItsOwnUpstreamsIsReported(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	warnings := provisionWarnings(t, `:0 {
	route {
		fair_queue {
			name llama
			upstream 127.0.0.1:9 2
			upstream 127.0.0.1:10 2
			requeue_on 503
		}
		reverse_proxy 127.0.0.1:9 127.0.0.1:10
	}
}`, poolMismatchMsg)
	require.Len(t, warnings, 1)
	w := warnings[0]
	assert.Equal(t, "warn", w["level"])
	assert.Equal(t, "llama", w["queue"])
	assert.Contains(t, w["msg"], "dynamic fair_queue")
}

func TestPoolWithDynamicFairQueueIsNotReported(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for name, site := range map[string]string{
		"pool, dynamic fair_queue": `route {
		fair_queue {
			upstream 127.0.0.1:9 2
		}
		reverse_proxy {
			dynamic fair_queue
		}
	}`,
		"no pool, static upstream": `route {
		fair_queue {
			permits 2
		}
		reverse_proxy 127.0.0.1:9
	}`,
	} {
		t.Run(name, func(t *testing.T) {
			assert.Empty(t, provisionWarnings(t, ":0 {\n\t"+site+"\n}", poolMismatchMsg))
		})
	}
}

// A reverse_proxy for other paths may come between a pool's fair_queue
// and its `dynamic fair_queue` reverse_proxy: Caddy sorts a site's
// reverse_proxy directives by their paths' length, so `/metrics` goes
// before `/v1/*`. The pool's requests never reach it: nothing is wrong,
// and nothing is logged. A reverse_proxy with its own upstreams that
// they can reach still is.
func TestPoolWhoseDynamicReverseProxyFollowsAnotherPathsIsNotReported(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	assert.Empty(t, provisionWarnings(t, `:0 {
	fair_queue /v1/* {
		upstream 127.0.0.1:9 2
	}
	reverse_proxy /v1/* {
		dynamic fair_queue
	}
	reverse_proxy /metrics 127.0.0.1:11
}`, poolMismatchMsg), "the pool's requests go to the dynamic reverse_proxy")

	for name, site := range map[string]string{
		"its own path's static reverse_proxy": `fair_queue /v1/* {
		upstream 127.0.0.1:9 2
	}
	reverse_proxy /v1/* 127.0.0.1:9
	reverse_proxy /metrics 127.0.0.1:11`,
		"a static reverse_proxy in its handle block": `handle /v1/* {
		fair_queue {
			upstream 127.0.0.1:9 2
		}
		reverse_proxy 127.0.0.1:9
	}
	handle {
		reverse_proxy {
			dynamic fair_queue
		}
	}`,
	} {
		t.Run(name, func(t *testing.T) {
			assert.Len(t, provisionWarnings(t, ":0 {\n\t"+site+"\n}", poolMismatchMsg), 1)
		})
	}
}

// A named route runs where `invoke` names it, and the walk follows it
// there (its handlers in a route block: the Caddyfile adapter keeps one
// directive of a named route's block): a pool in a named route whose reverse_proxy has upstreams of
// its own, or a pool whose invoke runs such a reverse_proxy, is logged
// as any other (neither was: invoke ended the walk, and a named route
// was never read); one whose named route takes the granted upstream is
// not.
func TestPoolThroughANamedRouteIsCheckedToo(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for name, tc := range map[string]struct {
		caddyfile string
		warnings  int
	}{
		"the pool and its static reverse_proxy in the named route": {`&(llm) {
	route {
		fair_queue {
			upstream 127.0.0.1:9 2
		}
		reverse_proxy 127.0.0.1:9
	}
}
:0 {
	invoke llm
}`, 1},
		"the named route's static reverse_proxy after the pool": {`&(proxy) {
	reverse_proxy 127.0.0.1:9
}
:0 {
	route {
		fair_queue {
			upstream 127.0.0.1:9 2
		}
		invoke proxy
	}
}`, 1},
		"the named route's dynamic reverse_proxy after the pool": {`&(proxy) {
	reverse_proxy {
		dynamic fair_queue
	}
}
:0 {
	route {
		fair_queue {
			upstream 127.0.0.1:9 2
		}
		invoke proxy
	}
}`, 0},
		"the pool and its dynamic reverse_proxy in the named route": {`&(llm) {
	route {
		fair_queue {
			upstream 127.0.0.1:9 2
		}
		reverse_proxy {
			dynamic fair_queue
		}
	}
}
:0 {
	invoke llm
}`, 0},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Len(t, provisionWarnings(t, tc.caddyfile, poolMismatchMsg), tc.warnings)
			assert.Empty(t, placementWarnings(t, tc.caddyfile), "a reverse_proxy follows the fair_queue")
		})
	}
}
