package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// BenchmarkScriptPrelude: what Redis spends on a script call before the
// script's own work: a call that returns at once, with one key, with the
// queue's whole key layout, and after the functions every script
// starts with (prelude: each call defines them again, as EVALSHA runs
// the whole script). The fast path's two calls pay the last line's cost
// each (BenchmarkFastPath in the external tests).
func BenchmarkScriptPrelude(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	s := New(rdb, "prelude", Options{})
	var pre strings.Builder
	pre.WriteString(keyTable())
	for _, f := range prelude {
		src, err := luaFS.ReadFile("lua/" + f + ".lua")
		if err != nil {
			b.Fatal(err)
		}
		pre.Write(src)
		pre.WriteString("\n")
	}
	for _, c := range []struct {
		name, src string
		keys      []string
	}{
		{"return/1-key", "return 1", s.keys[:1]},
		{"return/all-keys", "return 1", s.keys},
		{"prelude/all-keys", pre.String() + "return 1", s.keys},
	} {
		b.Run(c.name, func(b *testing.B) {
			sc := redis.NewScript(c.src)
			args := s.args("t", fairqueue.Limits{Permits: 4, Lease: 10 * time.Second}, "n")
			if err := sc.Run(context.Background(), rdb, c.keys, args...).Err(); err != nil {
				b.Fatal(err)
			}
			c0 := RedisCPU(b, rdb)
			b.ResetTimer()
			for range b.N {
				if err := sc.Run(context.Background(), rdb, c.keys, args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((RedisCPU(b, rdb)-c0).Microseconds())/float64(b.N), "redis-cpu-us/op")
		})
	}
}

// RedisCPU is the CPU time (user + system) the Redis server has used so
// far, from INFO cpu. Test only (the benchmarks of both test packages).
func RedisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
