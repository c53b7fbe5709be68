package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many waiting clients leave just as the permit comes (the grant races
// their departures), on each store and over each protocol, in front of
// an upstream that runs on a request whose client left: none keeps the
// permit, the queue empties, the upstream never runs more than one, and
// the next request is served.
func TestClientsLeavingAsTheyAreGrantedNeverRunBesideOthersOverEachProtocol(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		for _, proto := range []string{"h1", "h2", "h3"} {
			t.Run(store+"/"+proto, func(t *testing.T) {
				t.Cleanup(func() { poolEmpty(t) })
				up := newStubbornUpstream(t, 300*time.Millisecond)
				name := "granted-race-" + store + "-" + proto
				s := runTLSCaddy(t, fmt.Sprintf(
					`{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"60s","abort_grace":"1500ms"%s}`,
					name, storeJSON(t, store)),
					fmt.Sprintf(`{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, up.dial()))
				c := s.client(t, proto)
				first := chat(context.Background(), c, s.url, `{"model":"m","messages":[{"role":"user","content":"hold"}]}`)
				require.Eventually(t, func() bool { return up.running.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

				const n = 20
				ctx, cancel := context.WithCancel(context.Background())
				var gone []<-chan answer
				for i := range n {
					gone = append(gone, chat(ctx, c, s.url, fmt.Sprintf(`{"model":"m","stream":%v}`, i%2 == 0)))
				}
				waitQueueWaiting(t, name, n)
				up.release <- struct{}{} // the head is granted as the clients leave
				cancel()
				assert.Equal(t, http.StatusOK, got(t, first).status)
				for _, ch := range gone {
					got(t, ch)
				}
				waitQueueWaiting(t, name, 0)

				a := got(t, chat(context.Background(), c, s.url, `{"model":"m"}`))
				require.NoError(t, a.err)
				assert.Equal(t, http.StatusOK, a.status)
				assert.Equal(t, int32(1), up.most.Load(), "a request ran beside another at the upstream (permits 1)")
			})
		}
	}
}
