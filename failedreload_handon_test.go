package caddyfairqueue

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// handOnConfig is olderConfig's one route, listening on port, with the
// apps before http (app: a failing one).
func handOnConfig(port, permits int, u *peakUpstream, app string) string {
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{%s"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"match":[{"path":["/0"]}],"handle":[
		{"handler":"fair_queue","name":"older","permits":%d,"max_wait":"1m"},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, app, port, permits, u.dial())
}

// olderPermits is the permits in force on queue "older".
func olderPermits() int {
	for _, e := range openEngines() {
		if e.name == "older" {
			return e.q.Config().Permits
		}
	}
	return -1
}

// The second config's 3 permits, on the first config's unchanged route,
// apply at the first config's cleanup, before it serves. A third config
// (2 permits, another upstream) serves on a port of its own, then fails
// to start: the second config, in force again, must have its 3 permits
// back on the queue, as it had before, not the failed config's 2.
func TestAFailedReloadLeavesTheSettingsHandedOnBeforeIt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, c := newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(handOnConfig(port, 1, a, "")), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	onA := sendOlder(t, port, "/0", 1)
	require.Eventually(t, func() bool { return a.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the first config's holder on A")

	require.NoError(t, caddy.Load([]byte(handOnConfig(port, 3, a, "")), false))
	require.Equal(t, 3, olderPermits(), "the second config's permits handed on at the first's cleanup")

	other := freePort(t)
	failing.release = make(chan struct{})
	t.Cleanup(func() { closeOnce(failing.release) })
	loaded := loadFailing(t, handOnConfig(other, 2, c, failStartApp(other)))
	onC := sendOlder(t, other, "/0", 1) // the failing config serves: its 2 permits
	require.Eventually(t, func() bool { return olderPermits() == 2 && c.now.Load() == 1 }, 10*time.Second,
		5*time.Millisecond, "the failing config's request on C")
	closeOnce(failing.release)
	select {
	case err := <-loaded:
		require.Error(t, err, "the third config fails to start")
	case <-time.After(10 * time.Second):
		t.Fatal("the failing load did not return")
	}
	assert.Equal(t, 3, olderPermits(), "the permits in force after the failed reload")

	a.open()
	c.open()
	assert.Equal(t, http.StatusOK, <-onA)
	assert.Equal(t, http.StatusOK, <-onC)
}
