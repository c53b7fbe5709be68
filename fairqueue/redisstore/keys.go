package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The key scheme, for the tools that read Redis without a Store (the
// caddy fair-queue command): every key of a queue is its tag, a colon and
// one of keyNames, such as "{fair_queue:default}:epoch".

// braces are replaced in a tag's parts: they would change the hash tag
// and split the queue across Cluster slots.
var braces = strings.NewReplacer("{", "_", "}", "_")

// TagOf returns the hash tag that starts every key of queue name under
// prefix ("": DefaultKeyPrefix), e.g. "{fair_queue:default}".
func TagOf(prefix, name string) string {
	return "{" + braces.Replace(cmp.Or(prefix, DefaultKeyPrefix)) + ":" + braces.Replace(name) + "}"
}

// Keys returns the name of every key the queue may have, all starting
// with Tag: what Purge deletes, for the tools that check which exist.
func (s *Store) Keys() []string { return slices.Clone(s.keys) }

// ListQueues lists, sorted, the queues under prefix that have state in
// rdb, by their epoch key (the first key a queue gets; the last node to
// leave deletes it). A name is as it stands in the tag (braces replaced).
// It uses SCAN, not KEYS, so as not to block Redis; on a Redis Cluster
// it sees the keys of the node it runs on only.
func ListQueues(ctx context.Context, rdb redis.Cmdable, prefix string) ([]string, error) {
	unnamed := TagOf(prefix, "") // "{prefix:}"
	start, end := unnamed[:len(unnamed)-1], "}:epoch"
	var names []string
	iter := rdb.Scan(ctx, 0, globEscape(start)+"*"+globEscape(end), 1000).Iterator()
	for iter.Next(ctx) {
		name, ok := strings.CutPrefix(iter.Val(), start)
		if name, ok2 := strings.CutSuffix(name, end); ok && ok2 {
			names = append(names, name)
		}
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// globEscape quotes the characters special to Redis' MATCH patterns.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(s)
}
