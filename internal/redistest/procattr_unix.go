//go:build unix && !linux

package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group, so that signals
// reach its BGSAVE children too.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
