package benchmark

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// allowedCPUs lists the CPUs this process may run on (its affinity mask),
// in increasing order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := range 8 * 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
		if len(cpus) == set.Count() {
			break
		}
	}
	return cpus, nil
}

// setAffinity restricts every thread of process pid to cpus
// (sched_setaffinity applies to one thread; threads created later inherit
// the mask of the thread creating them). Threads may appear while the
// mask is being set, so the threads are listed again until a pass finds
// none it had not set.
func setAffinity(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	done := map[int]bool{}
	for pass := 0; ; pass++ {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return fmt.Errorf("threads of process %d: %w", pid, err)
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("sched_setaffinity of thread %d of process %d: %w", tid, pid, err)
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
		if pass > 100 {
			return fmt.Errorf("process %d keeps starting threads while its affinity is set", pid)
		}
	}
}
