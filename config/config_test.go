package config

import (
	"errors"
	"testing"

	"github.com/spf13/pflag"
)

func TestLoadWorkerGCPercent(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     string
		want    int
		wantErr error
	}{
		{"default", nil, "", DefaultWorkerGCPercent, nil},
		{"flag", []string{"--gc-percent", "800"}, "", 800, nil},
		{"environment", nil, "250", 250, nil},
		{"zero refused", []string{"--gc-percent", "0"}, "", 0, ErrGCPercent},
		{"negative refused", []string{"--gc-percent", "-1"}, "", 0, ErrGCPercent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("FEDSTREAM_GC_PERCENT", tc.env)
			}
			fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
			WorkerFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			w, err := LoadWorker(fs)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && w.GCPercent != tc.want {
				t.Fatalf("gc-percent %d, want %d", w.GCPercent, tc.want)
			}
		})
	}
}
