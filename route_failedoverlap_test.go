package caddyfairqueue

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A config that fails to load once it has served (its servers started,
// then another app failed to start) applies its settings to the queue it
// shares with the config in force: 4 permits, its route to B. A waiter
// of the config in force (1 permit, its route to A, which runs one
// request) granted under them runs on B, not on A beside A's request;
// also where its grant reaches it only as the failed config is cleaned
// up (the config in force's settings and route back).
func TestAWaiterGrantedUnderAFailedConfigsPermitsNeverRunsOnItsOwnRouteBesideItsRequest(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "while-live", true: "after-cleanup"}[late], func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			in := func(permits int) *Handler {
				return &Handler{Name: "route-failed-overlap", Permits: permits, MaxWait: caddy.Duration(time.Minute)}
			}
			a, b := newHolder(), newHolder()
			letAtCleanup(t, a, b)
			cur := provisionLocal(t, newContext(t), in(1))
			r0 := newRequest(context.Background(), `{}`).start(cur, a)
			a.waitEntered(t)
			w1 := newRequest(context.Background(), `{}`).start(cur, a)
			waitingIn(t, cur, 1)

			var holding atomic.Bool
			var arrived atomic.Int32
			hold := make(chan struct{})
			var once sync.Once
			unhold := func() { once.Do(func() { close(hold) }) }
			t.Cleanup(unhold)
			holding.Store(late)
			grantArrived = func(*engine) {
				if holding.Load() {
					arrived.Add(1)
					<-hold
				}
			}
			t.Cleanup(func() { grantArrived = func(*engine) {} })

			failed := provisionLocal(t, newContext(t), in(4))
			n1 := newRequest(context.Background(), `{}`).start(failed, b)
			if late {
				require.Eventually(t, func() bool { return arrived.Load() == 2 }, 10*time.Second, time.Millisecond,
					"w1 and n1 granted under the failed config's permits")
			} else {
				require.Eventually(t, func() bool { return a.count.Load()+b.count.Load() == 3 }, 10*time.Second, time.Millisecond,
					"w1 and n1 run under the failed config's permits")
			}
			require.NoError(t, failed.Cleanup()) // the load fails: the config in force's settings and route back
			unhold()
			require.Eventually(t, func() bool { return a.count.Load()+b.count.Load() == 3 }, 10*time.Second, time.Millisecond)
			assert.Equal(t, int32(1), a.count.Load(), "A ran a waiter granted under the failed config's permits beside r0, above its 1 permit")
			a.let()
			b.let()
			for _, r := range []*request{r0, w1, n1} {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
		})
	}
}
