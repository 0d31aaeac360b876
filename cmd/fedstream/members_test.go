package main

import (
	"strings"
	"testing"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// `ledger list` shows a pinned CA by its fingerprint, not a PEM spread
// over a dozen lines of the table.
func TestDetailsShowCAFingerprint(t *testing.T) {
	ca, err := tlsutil.NewCA("beta")
	if err != nil {
		t.Fatal(err)
	}
	got := details(map[string]string{"key": "k", federation.FieldCA: string(ca.CertPEM)})
	if strings.Contains(got, "\n") || !strings.HasPrefix(got, "ca=sha256:") || len(got) != len("ca=sha256:")+16 {
		t.Fatalf("details %q", got)
	}
}
