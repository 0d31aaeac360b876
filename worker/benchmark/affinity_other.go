//go:build !linux

package benchmark

import "errors"

var errNoAffinity = errors.New("CPU affinity is only set on Linux")

func allowedCPUs() ([]int, error) { return nil, errNoAffinity }

func setAffinity(int, []int) error { return errNoAffinity }
