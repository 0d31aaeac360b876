package benchmark

import "syscall"

// childProcAttr puts the child in its own process group (so it can be
// killed with everything it started) and has the kernel kill it if the
// parent dies without cleaning up.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
