package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// adminPoolJSON is what GET /fair_queue/ could answer for a pool, one
// upstream of it cooling and each with a share learned by adaptive, and
// for a queue without a pool whose adaptive share is a quarter.
const adminPoolJSON = `{"queues":[
 {"name":"chat","store":"local","permits":256,"max_wait_ms":20000,"lease_ms":30000,"node":"77aa00bb11cc22dd",
  "stats":{"waiting":40,"in_flight":64,"store_up":true,"grants":900},
  "snapshot":{"waiting":40,"head":[],"holders":[],"nodes":[],"flows":[],"grants":900,"learned_share":0.25}},
 {"name":"llama","store":"local","permits":12,"max_wait_ms":20000,"lease_ms":30000,"node":"9f2c1a0b3d4e5f60",
  "stats":{"waiting":0,"in_flight":5,"store_up":true,"grants":31},
  "snapshot":{"waiting":0,"head":[],"holders":[],"nodes":[],"flows":[],"grants":31,
   "upstreams":[{"dial":"10.0.0.5:8000","permits":8,"in_flight":5,"cool_left_ms":0,"kv_tokens":200000,"tokens_held":81200,"learned_share":0.5},
                {"dial":"10.0.0.6:8000","permits":4,"in_flight":0,"cool_left_ms":1240,"kv_tokens":100000,"tokens_held":0}]}}
]}`

// The table of status shows what an operator of a pool or of adaptive
// needs to read it: each upstream's permits, in flight, tokens and
// cooldown, and the capacity adaptive holds in force (of a pool
// upstream: its permits and tokens in force of those configured), not
// the configured ceiling alone: PERMITS 256 beside 64 in flight and 40
// waiting reads as a queue that stalls.
func TestStatusShowsAPoolsUpstreamsAndTheLearnedCapacity(t *testing.T) {
	out, err := runCLI(t, "status", "--admin", fakeAdmin(t, adminPoolJSON))
	require.NoError(t, err)
	assert.Equal(t, `QUEUE  STORE  PERMITS  WAITING  IN FLIGHT  NODES  GRANTS
chat   local  256      40       0          0      900
llama  local  12       0        0          0      31

chat
  capacity in force (adaptive): 64 of 256 permits (share 0.25)

llama
  UPSTREAM       PERMITS  IN FLIGHT  KV TOKENS        STATE
  10.0.0.5:8000  4 of 8   5          81200 of 100000  in dispatch
  10.0.0.6:8000  4        0          0 of 100000      cooling 1.2s
`, out)
}
