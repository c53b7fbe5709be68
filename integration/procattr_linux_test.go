package integration

import "syscall"

// sysProcAttr puts a Caddy process in its own process group and kills it
// if the test binary dies without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
