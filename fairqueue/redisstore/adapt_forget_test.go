package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A pool whose dials change on every deploy: Redis keeps the learned
// share and window (K.adapt, seven fields per upstream) and the last grant
// (K.ulast) of the upstreams in force only, not of every dial the queue
// ever had (every call under learned shares reads all of K.adapt).
func TestLearnedStateOfUpstreamsNoNodeHasIsDeleted(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "adaptforget"
	h := storetest.Harness{NewNode: func(t *testing.T, name string, cfg fairqueue.Config) *fairqueue.Queue {
		return newNode(t, srv, name, cfg).q
	}}
	_, inForce := storetest.RedeployPool(t, h, name, 10)
	tag := redisstore.TagOf("", name)
	var seen []int64
	eventually(t, 15*time.Second, func() bool {
		adapt := admin.HLen(context.Background(), tag+":adapt").Val()
		ulast := admin.HLen(context.Background(), tag+":ulast").Val()
		seen = []int64{adapt, ulast}
		return adapt <= int64(7*len(inForce)) && ulast <= int64(len(inForce))
	}, "learned state of upstreams no node has is kept: fields in adapt and ulast %v, for %d upstreams in force", &seen, len(inForce))
}
