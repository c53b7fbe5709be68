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
// each is looked at less often, so 50,000 waiting HTTP/1 requests cost
// the instance no more polls a second than 1,000 (each every 25 s, as
// docs/hostile-clients.md says).
func TestHangupLooksAreBoundedHoweverManyWait(t *testing.T) {
	require.LessOrEqual(t, float64(hangupBatch)/hangupEvery.Seconds(), float64(hangupLooksPerSecond))
	var l hangupList
	for i := range 50_000 {
		l.ws = append(l.ws, &hangupWatch{at: i})
	}
	seen := make(map[*hangupWatch]bool)
	turns := 0
	for len(seen) < len(l.ws) {
		b := l.nextBatch(nil)
		require.LessOrEqual(t, len(b), hangupBatch)
		for _, w := range b {
			seen[w] = true
		}
		turns++
	}
	require.Equal(t, 25*time.Second, time.Duration(turns)*hangupEvery, "a round of 50,000 watches")
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
	before := hangups.count.Load()

	ctx, w := watchHangup(context.Background(), r)
	require.NotNil(t, w)
	require.Equal(t, before+1, hangups.count.Load())
	_, err = client.Write([]byte("G")) // a pipelined byte, left unread
	require.NoError(t, err)
	time.Sleep(2 * hangupEvery)
	require.NoError(t, ctx.Err(), "a client that is still connected is not gone")
	require.NoError(t, client.Close())
	require.Eventually(t, func() bool { return ctx.Err() != nil }, 20*time.Second, 10*time.Millisecond, "the client's close is seen")
	require.True(t, w.stop())
	require.True(t, w.stop(), "a second stop changes nothing")
	require.Equal(t, before, hangups.count.Load())
}

// Each turn looks at the next batch of watches, so that every watch is
// looked at within the turns a round takes, and a watch taken out leaves
// the list whole; with none left the goroutine ends.
func TestHangupTurnsLookAtEachWatchInTurn(t *testing.T) {
	var l hangupList
	l.running = true
	ws := make([]*hangupWatch, 2*hangupBatch+hangupBatch/2)
	for i := range ws {
		ws[i] = &hangupWatch{at: i}
		l.ws = append(l.ws, ws[i])
	}
	seen := make(map[*hangupWatch]int)
	for range 3 {
		b := l.nextBatch(nil)
		require.Len(t, b, hangupBatch)
		for _, w := range b {
			seen[w]++
		}
	}
	require.Len(t, seen, len(ws), "every watch looked at within a round of 3 turns")
	for i := 0; i < len(ws); i += 2 {
		l.remove(ws[i])
	}
	require.Len(t, l.ws, len(ws)/2)
	for i, w := range l.ws {
		require.Equal(t, i, w.at)
		require.NotSame(t, ws[0], w)
	}
	require.Equal(t, int64(len(ws)/2), l.count.Load())
	for i := 1; i < len(ws); i += 2 {
		l.remove(ws[i])
	}
	require.Nil(t, l.nextBatch(nil))
	require.False(t, l.running, "the goroutine ends with the last watch")
	require.Zero(t, l.count.Load())
}
