package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pause stops process p (SIGSTOP), as a hung or descheduled worker looks
// to its peers: its sockets stay open and nothing answers. The returned
// resume continues it (SIGCONT); it is also called at cleanup, before
// the process is terminated, so a paused process can always end.
func (p *proc) pause(t *testing.T) (resume func()) {
	t.Helper()
	p.signal(syscall.SIGSTOP)
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			p.signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// procState is the one-letter state of a Linux process ("T": stopped),
// or "" where /proc does not tell.
func procState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces, so cut after the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// The pause helper stops and continues a real process.
func TestPauseHelper(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep command:", err)
	}
	p := &proc{name: "sleep", cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	defer func() { p.kill() }()
	waitState := func(want string) {
		deadline := time.Now().Add(10 * time.Second)
		for procState(cmd.Process.Pid) != want {
			if time.Now().After(deadline) {
				t.Fatalf("process state %q, want %q", procState(cmd.Process.Pid), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	resume := p.pause(t)
	waitState("T")
	resume()
	waitState("S")
}
