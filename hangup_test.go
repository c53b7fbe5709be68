package caddyfairqueue

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The looks of every watch together stay bounded: with many waiting,
// each looks less often, so 50,000 waiting HTTP/1 requests cost the
// instance no more polls a second than a few thousand.
func TestHangupLooksAreBoundedHoweverManyWait(t *testing.T) {
	require.Equal(t, hangupEvery, hangupInterval(1))
	require.Equal(t, hangupEvery, hangupInterval(hangupLooksPerSecond/2))
	for _, n := range []int64{10_000, 50_000, 1_000_000} {
		perSecond := float64(n) / hangupInterval(n).Seconds()
		require.LessOrEqual(t, perSecond, float64(hangupLooksPerSecond), "%d watches", n)
	}
}

// A watch of a real connection sees its client's close, and each watch
// leaves the count the looks are paced by as it stops.
func TestAHangupWatchSeesTheCloseAndLeavesTheCount(t *testing.T) {
	if !canSeeHangup {
		t.Skip("the connection is watched on Linux only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err := ln.Accept()
	require.NoError(t, err)
	defer server.Close()
	r, err := http.NewRequestWithContext(context.WithValue(context.Background(), connCtxKey{}, server), "POST", "/", nil)
	require.NoError(t, err)
	before := hangupWatches.Load()

	ctx, w := watchHangup(context.Background(), r)
	require.NotNil(t, w)
	require.Equal(t, before+1, hangupWatches.Load())
	_, err = client.Write([]byte("G")) // a pipelined byte, left unread
	require.NoError(t, err)
	time.Sleep(2 * hangupEvery)
	require.NoError(t, ctx.Err(), "a client that is still connected is not gone")
	require.NoError(t, client.Close())
	require.Eventually(t, func() bool { return ctx.Err() != nil }, 20*time.Second, 10*time.Millisecond, "the client's close is seen")
	require.True(t, w.stop())
	require.True(t, w.stop(), "a second stop changes nothing")
	require.Equal(t, before, hangupWatches.Load())
}
