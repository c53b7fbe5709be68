package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two fair_queue blocks without `name`, one per backend, are one queue,
// "default". With different permits the load failed with `queue
// "default" is configured by two fair_queue handlers with different
// permits (2 and 4): ...; handlers naming one queue must agree`, which
// tells an operator who named no queue neither why they are one nor
// what to change. The error says that a handler without name is the
// queue "default", and how to keep queues apart.
func TestHandlersWithoutNameThatDisagreeAreToldToNameTheirQueues(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	err := validate(t, `:8080 {
	route /a/* {
		fair_queue {
			permits 2
		}
		reverse_proxy 127.0.0.1:9
	}
	route /b/* {
		fair_queue {
			permits 4
		}
		reverse_proxy 127.0.0.1:10
	}
}
`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `queue "default" (the queue of every fair_queue without a name) is configured by two fair_queue handlers with different permits`)
	assert.Contains(t, err.Error(), `handlers naming one queue must agree; to keep their queues apart, give each its own name`)

	err = validate(t, `:8080 {
	route /a/* {
		fair_queue {
			name shared
			permits 2
		}
		reverse_proxy 127.0.0.1:9
	}
	route /b/* {
		fair_queue {
			name shared
			permits 4
		}
		reverse_proxy 127.0.0.1:10
	}
}
`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `queue "shared" is configured by two fair_queue handlers with different permits (2 and 4): both in the server on :8080; `+
		`handlers naming one queue must agree; to keep their queues apart, give each its own name`)
}
