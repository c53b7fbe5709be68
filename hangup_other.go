//go:build !linux

package caddyfairqueue

import "syscall"

// canSeeHangup: elsewhere than Linux nothing shows a closed end without
// reading past the bytes that came before it.
const canSeeHangup = false

// hungUp cannot tell here (canSeeHangup).
func hungUp(syscall.RawConn) bool { return false }
