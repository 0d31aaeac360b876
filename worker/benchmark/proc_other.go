//go:build !unix

package benchmark

import (
	"os"
	"syscall"
)

func childProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(p *os.Process) { _ = p.Kill() }

// processCPUNanos is not measured on this platform.
func processCPUNanos() int64 { return 0 }
