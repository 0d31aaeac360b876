package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
)

func TestTokensFromFileOrEnvironment(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	join := write("join", "join-from-file\n")
	admin := write("admin", "  admin-from-file  \n")
	empty := write("empty", "\n")
	two := write("two", "a\nb\n")
	tests := []struct {
		name             string
		args             []string
		env              map[string]string
		wantJoin, wantAd string
		wantErr          error
	}{
		{name: "files", args: []string{"--join-token-file", join, "--admin-token-file", admin}, wantJoin: "join-from-file", wantAd: "admin-from-file"},
		{name: "environment", env: map[string]string{"FEDSTREAM_JOIN_TOKEN": "join-env", "FEDSTREAM_ADMIN_TOKEN": "admin-env"}, wantJoin: "join-env", wantAd: "admin-env"},
		{name: "file named by environment", env: map[string]string{"FEDSTREAM_JOIN_TOKEN_FILE": join}, wantJoin: "join-from-file"},
		{name: "token and file", args: []string{"--join-token", "x", "--join-token-file", join}, wantErr: ErrTokenFile},
		{name: "empty file", args: []string{"--admin-token-file", empty}, wantErr: ErrTokenFile},
		{name: "two lines", args: []string{"--admin-token-file", two}, wantErr: ErrTokenFile},
		{name: "missing file", args: []string{"--join-token-file", filepath.Join(dir, "nope")}, wantErr: ErrTokenFile},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := pflag.NewFlagSet("coordinator", pflag.ContinueOnError)
			CoordinatorFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			c, err := LoadCoordinator(fs)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.JoinToken != tc.wantJoin || c.AdminToken != tc.wantAd {
				t.Fatalf("join %q admin %q, want %q %q", c.JoinToken, c.AdminToken, tc.wantJoin, tc.wantAd)
			}
		})
	}

	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	WorkerFlags(fs)
	if err := fs.Parse([]string{"--join-token-file", join}); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWorker(fs)
	if err != nil || w.JoinToken != "join-from-file" {
		t.Fatalf("worker join token %v, %v", w, err)
	}
}
