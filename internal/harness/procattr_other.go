//go:build unix && !linux

package harness

import "syscall"

// sysProcAttr puts a child in its own process group, so that a signal
// reaches its children too and a Ctrl-C at the terminal reaches only the
// parent, which stops it in order.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
