//go:build unix && !linux

package benchmark

import "syscall"

// childProcAttr puts the child in its own process group so that it can be
// killed with everything it started.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
