package procs

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CommandStats holds the call counts of INFO commandstats, by command name
// (lower case: "evalsha", "zcard").
type CommandStats map[string]int64

// Scripts returns the script calls: EVALSHA, EVAL and their read-only and
// function forms.
func (cs CommandStats) Scripts() int64 {
	return cs["evalsha"] + cs["eval"] + cs["evalsha_ro"] + cs["eval_ro"] + cs["fcall"] + cs["fcall_ro"]
}

// Total returns all calls except those of the bench itself (INFO and
// CONFIG).
func (cs CommandStats) Total() int64 {
	var n int64
	for name, calls := range cs {
		if name != "info" && name != "config|resetstat" && name != "config" {
			n += calls
		}
	}
	return n
}

// Sub returns cs - before, per command.
func (cs CommandStats) Sub(before CommandStats) CommandStats {
	out := CommandStats{}
	for name, calls := range cs {
		if d := calls - before[name]; d != 0 {
			out[name] = d
		}
	}
	return out
}

// ReadCommandStats reads INFO commandstats.
func ReadCommandStats(ctx context.Context, rdb *redis.Client) (CommandStats, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	return parseCommandStats(info), nil
}

// parseCommandStats parses lines such as
// "cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,...".
func parseCommandStats(info string) CommandStats {
	cs := CommandStats{}
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					cs[name] = n
				}
			}
		}
	}
	return cs
}
