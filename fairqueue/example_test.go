package fairqueue_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// One permit, two requests: the second waits until the first releases.
// With redisstore.New(client, "chat", redisstore.Options{}) instead of
// memstore.New(), every process opening "chat" shares the permit.
func Example() {
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{Name: "chat", Permits: 1, MaxWait: time.Second})
	if err != nil {
		panic(err)
	}
	defer q.Close()

	first, _ := q.Acquire(context.Background(), fairqueue.Request{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		second, err := q.Acquire(context.Background(), fairqueue.Request{})
		if err != nil {
			fmt.Println("second:", err)
			return
		}
		defer second.Release()
		fmt.Println("second granted after waiting at position", second.Position())
	}()
	time.Sleep(50 * time.Millisecond) // the first request works
	first.Release()
	<-done

	// Holding the only permit, a third request times out.
	held, _ := q.Acquire(context.Background(), fairqueue.Request{})
	defer held.Release()
	_, err = q.Acquire(context.Background(), fairqueue.Request{})
	fmt.Println(errors.Is(err, fairqueue.ErrTimeout), fairqueue.ReasonOf(err))
	// Output:
	// second granted after waiting at position 1
	// true timeout
}
