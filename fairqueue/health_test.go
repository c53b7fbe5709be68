package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"
)

// TestOutageMarksTheStoreDownOnlyWhenItCannotBeReached: a request the
// on_store_error policy answered because the store refused its dial
// marks the store down at once; one that timed out on a slow store (or
// found the queue closed, or the client pool busy) leaves that to the
// count of consecutive failures.
func TestOutageMarksTheStoreDownOnlyWhenItCannotBeReached(t *testing.T) {
	dial := fmt.Errorf("acquire: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")})
	for _, tc := range []struct {
		name string
		err  error
		down bool
	}{
		{"refused dial", dial, true},
		{"read timeout", &net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}, false},
		{"deadline", context.DeadlineExceeded, false},
		{"closed queue", errClosed, false},
		{"busy pool", ErrStoreBusy, false},
	} {
		var h health
		h.downAfter.Store(2)
		h.outage(zap.NewNop(), tc.err)
		assert.Equal(t, !tc.down, h.up(), tc.name)
	}
}
