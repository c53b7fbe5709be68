package caddyfairqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"golang.org/x/net/http2"
)

// errDropped takes the errors of an HTTP/1 connection the upstream
// closed, as reverse_proxy wraps them, and none of an HTTP/2 stream's
// reset, a lost HTTP/2 connection's, or a timeout.
func TestErrDroppedTellsAClosedHTTP1ConnectionFromTheRest(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	pipe := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
	// The request's body written on a connection that the transport
	// closed as its read side saw the upstream end it (Go reports it as
	// the body's read error, undecorated), or the other way round.
	closedMidWrite := &net.OpError{Op: "readfrom", Net: "tcp", Err: &net.OpError{Op: "write", Net: "tcp", Err: net.ErrClosed}}
	for _, c := range []struct {
		err     error
		dropped bool
	}{
		{io.EOF, true},
		{reset, true},
		{fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", pipe), true},
		{errors.New("http: server closed idle connection"), true},
		{closedMidWrite, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}, true},
		{http2.StreamError{StreamID: 3, Code: http2.ErrCodeInternal}, false},
		{http2.GoAwayError{LastStreamID: 1, ErrCode: http2.ErrCodeNo}, false},
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
		{nil, false},
	} {
		err := c.err
		if err != nil {
			err = caddyhttp.Error(502, err)
		}
		assert.Equal(t, c.dropped, errDropped(err), "%v", c.err)
	}
}
