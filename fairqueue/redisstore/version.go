package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// detectSharded tells from the server's major version (7 and later)
// whether to use sharded Pub/Sub. It reads HELLO, which every user may
// run, or INFO where the server does not know HELLO (Redis 5).
func (s *Store) detectSharded(ctx context.Context) (bool, error) {
	if s.sharded != nil {
		return *s.sharded, nil
	}
	version, err := s.serverVersion(ctx)
	if err != nil {
		return false, err
	}
	major, _ := strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	return major >= 7, nil
}

// serverVersion returns the server's version ("" where it says none).
// HELLO without arguments (Redis 6.2+) only reports, in the
// connection's protocol, and needs no grant: INFO is @dangerous, which
// the ACL of the queue (ACLRules) does not grant, so that reading it
// first would write an ACL LOG entry each time a queue opens. A server
// that answers HELLO with an error (Redis 5 does not know it, 6.0 wants
// a protocol version) is read with INFO.
func (s *Store) serverVersion(ctx context.Context) (string, error) {
	v, err := s.do(ctx, "HELLO").Result()
	if err == nil {
		return helloVersion(v), nil
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) || ctx.Err() != nil {
		return "", err // not the server's answer: Redis unreachable, ctx done
	}
	info, ierr := s.info(ctx) // bounded by ctx (see bounded)
	if ierr != nil {
		return "", ierr
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "", nil
}

// helloVersion reads the version out of HELLO's reply: a flat list of
// fields and values in RESP2, a map in RESP3.
func helloVersion(v any) string {
	switch r := v.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			if r[i] == "version" {
				s, _ := r[i+1].(string)
				return s
			}
		}
	case map[any]any:
		s, _ := r["version"].(string)
		return s
	}
	return ""
}
