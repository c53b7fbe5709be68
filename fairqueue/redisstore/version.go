package redisstore

import (
	"context"
	"strconv"
	"strings"
)

// detectSharded tells from the server's major version (7 and later)
// whether to use sharded Pub/Sub. It reads INFO, or HELLO where the user
// may not run INFO (a @dangerous command, often denied by ACL).
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
func (s *Store) serverVersion(ctx context.Context) (string, error) {
	info, err := s.info(ctx) // bounded by ctx (see bounded)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "NOPERM") {
			return "", err
		}
		// HELLO without arguments (Redis 6+, as ACL is) only reports.
		v, herr := s.do(ctx, "HELLO").Result()
		if herr != nil {
			return "", err
		}
		return helloVersion(v), nil
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
