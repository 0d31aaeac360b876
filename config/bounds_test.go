package config

import (
	"errors"
	"testing"

	"github.com/spf13/pflag"
)

// The DCAA bounds are worker settings: defaults, flags, and negative
// values refused with an error naming the setting.
func TestLoadWorkerDCAABounds(t *testing.T) {
	load := func(args ...string) (*Worker, error) {
		fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
		WorkerFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return LoadWorker(fs)
	}
	w, err := load()
	if err != nil || w.DCAAKeepTuples != 256<<10 || w.InputPendingTuples != 64<<10 {
		t.Fatalf("defaults: %+v, %v", w, err)
	}
	w, err = load("--dcaa-keep-tuples", "1000", "--input-pending-tuples", "500")
	if err != nil || w.DCAAKeepTuples != 1000 || w.InputPendingTuples != 500 {
		t.Fatalf("flags: %+v, %v", w, err)
	}
	for _, name := range []string{"dcaa-keep-tuples", "input-pending-tuples"} {
		if _, err := load("--"+name, "-1"); !errors.Is(err, ErrCount) {
			t.Fatalf("--%s -1: %v, want ErrCount", name, err)
		}
	}
}
