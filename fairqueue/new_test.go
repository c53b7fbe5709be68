package fairqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// New without a store is refused with an error that says so, not a Queue
// whose first Acquire (or Close) panics on the missing store.
func TestNewRefusesANilStore(t *testing.T) {
	t.Parallel()
	q, err := fairqueue.New(nil, fairqueue.Config{Permits: 1, MaxWait: time.Second})
	require.Error(t, err, "a Queue without a store: its first Acquire or Close panics")
	assert.Nil(t, q)
	assert.Contains(t, err.Error(), "store")
}
