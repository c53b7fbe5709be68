package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// honoursContext reports whether rdb ends a call at its context's
// deadline or cancellation (go-redis' ContextTimeoutEnabled). Without it
// go-redis reads a reply until its own ReadTimeout, whatever the context
// says; a client of unknown type is taken not to.
func honoursContext(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// bounded is a client's scripting whose calls end at their context's
// deadline or cancellation, for a client that does not (honoursContext):
// a store call bounded by the max wait or the store timeout must not wait
// out the client's read timeout on a frozen Redis. A call cut off goes on
// in the background until the client's own timeout, its answer dropped;
// like any call cut off at its deadline, it may have run.
type bounded struct{ redis.Scripter }

// Eval implements redis.Scripter.
func (b bounded) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return within(ctx, func() *redis.Cmd { return b.Scripter.Eval(ctx, script, keys, args...) }, cutCmd)
}

// EvalSha implements redis.Scripter.
func (b bounded) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return within(ctx, func() *redis.Cmd { return b.Scripter.EvalSha(ctx, sha1, keys, args...) }, cutCmd)
}

// EvalRO implements redis.Scripter.
func (b bounded) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return within(ctx, func() *redis.Cmd { return b.Scripter.EvalRO(ctx, script, keys, args...) }, cutCmd)
}

// EvalShaRO implements redis.Scripter.
func (b bounded) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return within(ctx, func() *redis.Cmd { return b.Scripter.EvalShaRO(ctx, sha1, keys, args...) }, cutCmd)
}

func cutCmd(ctx context.Context) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(ctx.Err())
	return cmd
}

// within returns call's result, or cut's once ctx ends first (call then
// goes on in the background).
func within[T any](ctx context.Context, call func() T, cut func(context.Context) T) T {
	if ctx.Done() == nil {
		return call()
	}
	done := make(chan T, 1)
	go func() { done <- call() }()
	select {
	case v := <-done:
		return v
	case <-ctx.Done():
		return cut(ctx)
	}
}
