//go:build unix

package benchmark

import (
	"os"
	"syscall"
)

// killGroup kills the child's whole process group (it leads its own).
func killGroup(p *os.Process) {
	if err := syscall.Kill(-p.Pid, syscall.SIGKILL); err != nil {
		_ = p.Kill()
	}
}
