package caddyfairqueue

import (
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
