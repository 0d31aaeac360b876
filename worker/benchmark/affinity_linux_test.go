package benchmark

import (
	"os/exec"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSetAffinity pins every thread of a child process to one CPU and
// lets it run everywhere again.
func TestSetAffinity(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil || len(cpus) == 0 {
		t.Fatalf("allowed CPUs: %v, %v", cpus, err)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no child to pin: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	mask := func() []int {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(cmd.Process.Pid, &set); err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, c := range cpus {
			if set.IsSet(c) {
				out = append(out, c)
			}
		}
		return out
	}
	last := cpus[len(cpus)-1]
	if err := setAffinity(cmd.Process.Pid, []int{last}); err != nil {
		t.Fatal(err)
	}
	if got := mask(); !slices.Equal(got, []int{last}) {
		t.Fatalf("pinned to %v, want [%d]", got, last)
	}
	if err := setAffinity(cmd.Process.Pid, cpus); err != nil {
		t.Fatal(err)
	}
	if got := mask(); !slices.Equal(got, cpus) {
		t.Fatalf("unpinned to %v, want %v", got, cpus)
	}
}
