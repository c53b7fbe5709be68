package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The model-based test under faults (storetest.Model) on a real
// redis-server: each node has its own client (with a production queue
// client's short timeouts and one retry) and subscription. A restart is
// FLUSHALL and SCRIPT FLUSH (the data and the script cache are gone) and
// every connection dropped (Pub/Sub resubscribes, calls in flight fail
// or are retried), as a restart without persistence does. Long run: make
// soak.
func TestModelUnderFaults(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	bg := context.Background()
	storetest.Model(t, storetest.ModelHarness{
		NewStore: func(name string) (fairqueue.Store, func()) {
			rdb := redis.NewClient(&redis.Options{
				Addr:                  srv.Addr(),
				DialTimeout:           redisstore.DefaultDialTimeout,
				ReadTimeout:           redisstore.DefaultReadTimeout,
				WriteTimeout:          redisstore.DefaultWriteTimeout,
				MaxRetries:            redisstore.DefaultMaxRetries,
				ContextTimeoutEnabled: true,
			})
			return redisstore.New(rdb, name, redisstore.Options{}), func() { _ = rdb.Close() }
		},
		Restart: func() error {
			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			if err := admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				return err
			}
			for _, typ := range []string{"pubsub", "normal"} {
				if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", typ, "SKIPME", "yes").Err(); err != nil {
					return err
				}
			}
			return nil
		},
		Leftovers: func(name string) ([]string, error) {
			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			tag := redisstore.New(admin, name, redisstore.Options{}).Tag()
			return admin.Keys(ctx, tag+"*").Result()
		},
	})
}
