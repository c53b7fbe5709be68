package fairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidateRefusesKVTokensOnSomeUpstreamsWithoutTheQueuesOwn(t *testing.T) {
	some := []Upstream{{Dial: "a:1", Permits: 1, KVTokens: 10}, {Dial: "b:1", Permits: 1}, {Dial: "c:1", Permits: 1}}
	assert.EqualError(t, Config{Upstreams: some}.Validate(),
		"kv_tokens is set on 1 of the 3 upstreams, not on upstreams[1] (b:1): set it on every upstream, or kv_tokens on the queue too")

	assert.NoError(t, Config{Upstreams: some, KVTokens: 15}.Validate(), "the queue's kv_tokens counts the others")
	every := []Upstream{{Dial: "a:1", Permits: 1, KVTokens: 10}, {Dial: "b:1", Permits: 1, KVTokens: 5}}
	assert.NoError(t, Config{Upstreams: every}.Validate(), "the queue's capacity is their sum")
	none := []Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}
	assert.NoError(t, Config{Upstreams: none}.Validate(), "tokens are not counted")
}
