//go:build unix && !linux

package integration

import "syscall"

// sysProcAttr puts a Caddy process in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
