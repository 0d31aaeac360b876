package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

// The federation section reads from YAML (federation: {bind, join, ...}),
// flags (--federation.join) and the environment (FEDSTREAM_FEDERATION_BIND).
func TestLoadCoordinatorFederation(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	yaml := "org: alpha\nfederation:\n  bind: 127.0.0.1:7502\n  grpc-addr: 127.0.0.1:7503\n  join: [127.0.0.1:7602, 127.0.0.1:7702]\n  keyring-file: /etc/fed.key\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(args ...string) *Coordinator {
		t.Helper()
		fs := pflag.NewFlagSet("coordinator", pflag.ContinueOnError)
		CoordinatorFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		c, err := LoadCoordinator(fs)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := load("--config", file)
	f := c.Federation
	if f.Bind != "127.0.0.1:7502" || f.GRPCAddr != "127.0.0.1:7503" || f.KeyringFile != "/etc/fed.key" ||
		!slices.Equal(f.Join, []string{"127.0.0.1:7602", "127.0.0.1:7702"}) {
		t.Fatalf("from YAML: %+v", f)
	}
	c = load("--config", file, "--federation.join", "127.0.0.1:9,127.0.0.1:10")
	if !slices.Equal(c.Federation.Join, []string{"127.0.0.1:9", "127.0.0.1:10"}) {
		t.Fatalf("flag over YAML: %+v", c.Federation)
	}
	t.Setenv("FEDSTREAM_FEDERATION_BIND", "127.0.0.1:11")
	if c = load(); c.Federation.Bind != "127.0.0.1:11" {
		t.Fatalf("from the environment: %+v", c.Federation)
	}
}
