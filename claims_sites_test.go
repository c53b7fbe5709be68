package caddyfairqueue

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two sites that name one queue with different settings: the error
// named the queue and both values, but only Caddy's module path of the
// second handler ("server srv1: ... route 0"), nothing of the first.
// It now says where each handler is, by its server's listen address.
func TestHandlersThatDisagreeOnAQueueAreNamedByTheirServers(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	err := validate(t, `api.example.com:8080 {
	fair_queue {
		name shared
		permits 4
	}
	respond ok
}

chat.example.com:8081 {
	handle /v1/* {
		fair_queue {
			name shared
			permits 8
		}
		respond ok
	}
}
`)
	require.Error(t, err)
	// Caddy provisions its servers in no set order: either may be first.
	msg := err.Error()
	assert.True(t, strings.Contains(msg, `queue "shared" is configured by two fair_queue handlers with different permits (4 and 8): `+
		`the first in the server on :8080, the other in the server on :8081`) ||
		strings.Contains(msg, `queue "shared" is configured by two fair_queue handlers with different permits (8 and 4): `+
			`the first in the server on :8081, the other in the server on :8080`), msg)

	// In one server, the values tell them apart.
	err = validate(t, `:8080 {
	handle /a {
		fair_queue {
			name shared
			permits 4
		}
		respond ok
	}
	handle /b {
		fair_queue {
			name shared
			permits 8
		}
		respond ok
	}
}
`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `queue "shared" is configured by two fair_queue handlers with different permits (4 and 8): both in the server on :8080`)
}

// In Redis a brace in a queue name or key prefix stands as "_" in its
// keys (redisstore.TagOf), so names and prefixes a brace apart are one
// queue there, sharing its permits: handlers that name it so must agree
// like handlers that spell it alike. The local store keeps them apart.
func TestHandlersNamingOneRedisQueueABraceApartMustAgree(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	site := func(name1, prefix1, name2, prefix2, store string) string {
		q := func(path, name, prefix, permits string) string {
			s := "\thandle " + path + " {\n\t\tfair_queue {\n\t\t\tname " + strconv.Quote(name) + "\n\t\t\tpermits " + permits + "\n"
			if store == "redis" {
				s += "\t\t\tredis {\n\t\t\t\turl redis://127.0.0.1:6379\n"
				if prefix != "" {
					s += "\t\t\t\tkey_prefix " + strconv.Quote(prefix) + "\n"
				}
				s += "\t\t\t}\n"
			}
			return s + "\t\t}\n\t\trespond ok\n\t}\n"
		}
		return ":8080 {\n" + q("/a", name1, prefix1, "4") + q("/b", name2, prefix2, "8") + "}\n"
	}
	for _, c := range []struct{ name1, prefix1, name2, prefix2 string }{
		{"team}", "", "team_", ""},
		{"a}b", "", "a_b", ""},
		{"team", "edge{", "team", "edge_"},
		{"team", "", "team", "fair_queue"}, // the default prefix, spelled out
	} {
		err := validate(t, site(c.name1, c.prefix1, c.name2, c.prefix2, "redis"))
		if assert.Error(t, err, "%+v", c) {
			assert.Contains(t, err.Error(), "with different permits (4 and 8)", "%+v", c)
		}
	}
	require.NoError(t, validate(t, site("team}", "", "team_", "", "local")), "two local queues")
}

// In Redis a queue's keys start with "{<prefix>:<name>}"
// (redisstore.TagOf), so a colon may move between the key prefix and the
// name: prefix "edge" with name "eu:team" and prefix "edge:eu" with name
// "team" are one queue there, sharing its permits, and handlers that
// name it so must agree like handlers that spell it alike.
func TestHandlersNamingOneRedisQueueAColonApartMustAgree(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	q := func(path, name, prefix, permits string) string {
		return "\thandle " + path + " {\n\t\tfair_queue {\n\t\t\tname " + strconv.Quote(name) + "\n\t\t\tpermits " + permits +
			"\n\t\t\tredis {\n\t\t\t\turl redis://127.0.0.1:6379\n\t\t\t\tkey_prefix " + strconv.Quote(prefix) +
			"\n\t\t\t}\n\t\t}\n\t\trespond ok\n\t}\n"
	}
	for _, c := range []struct{ name1, prefix1, name2, prefix2 string }{
		{"eu:team", "edge", "team", "edge:eu"},
		{"edge:team", "fair_queue", "team", "fair_queue:edge"},
	} {
		err := validate(t, ":8080 {\n"+q("/a", c.name1, c.prefix1, "4")+q("/b", c.name2, c.prefix2, "8")+"}\n")
		if assert.Error(t, err, "%+v", c) {
			assert.Contains(t, err.Error(), "with different permits (4 and 8)", "%+v", c)
		}
	}
}

// A config's claims go with it: a reload leaves nothing behind of the
// handlers of the config it replaced, whatever store they name their
// queues in (in Redis a claim keys on the queue's hash tag, not on its
// name as written).
func TestClaimsGoWithTheirConfig(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	count := func() int {
		claims.Lock()
		defer claims.Unlock()
		return len(claims.m) + len(claims.named)
	}
	for _, store := range []string{"", "\t\t\tredis {\n\t\t\t\turl redis://127.0.0.1:6379\n\t\t\t}\n"} {
		before := count()
		require.NoError(t, validate(t, ":8080 {\n\thandle /a {\n\t\tfair_queue {\n\t\t\tname team\n\t\t\tpermits 4\n"+store+
			"\t\t}\n\t\trespond ok\n\t}\n\thandle /b {\n\t\tfair_queue {\n\t\t\tname team\n\t\t\tpermits 4\n"+store+
			"\t\t}\n\t\trespond ok\n\t}\n}\n"))
		assert.Equal(t, before, count(), "claims left behind by a config cleaned up (store %q)", store)
	}
}
