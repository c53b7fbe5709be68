package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group, so that signals
// reach its BGSAVE children too, and kills it if the test binary dies
// without running its cleanups (a panic or a -timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
