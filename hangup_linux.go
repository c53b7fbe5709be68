package caddyfairqueue

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// canSeeHangup: hungUp can tell.
const canSeeHangup = true

// hungUp reports whether the client's end of the connection is closed
// (its FIN or a reset has arrived), whatever bytes it sent before that
// wait unread: poll's POLLRDHUP, which reads nothing.
func hungUp(rc syscall.RawConn) bool {
	gone := false
	_ = rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil && n > 0 {
			gone = p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
}
