package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestTagOfIsTheTagOfEveryKeyOfTheQueueAndKeepsItInOneSlot(t *testing.T) {
	assert.Equal(t, "{fair_queue:default}", redisstore.TagOf("", "default"))
	assert.Equal(t, "{llm:_x_}", redisstore.TagOf("llm", "{x}"), "a brace would change the hash tag")
	assert.Equal(t, redisstore.TagOf("llm", "chat"), redisstore.New(nil, "chat", redisstore.Options{KeyPrefix: "llm"}).Tag())
}

func TestListQueuesFindsTheQueuesOfOnePrefixWithState(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, q := range []struct{ prefix, name string }{{"", "chat"}, {"", "a*b"}, {"other", "embed"}} {
		st := redisstore.New(rdb, q.name, redisstore.Options{KeyPrefix: q.prefix})
		_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: time.Minute}})
		require.NoError(t, err)
	}
	names, err := redisstore.ListQueues(ctx, rdb, "")
	require.NoError(t, err)
	assert.Equal(t, []string{"a*b", "chat"}, names)
	names, err = redisstore.ListQueues(ctx, rdb, "other")
	require.NoError(t, err)
	assert.Equal(t, []string{"embed"}, names)
}
