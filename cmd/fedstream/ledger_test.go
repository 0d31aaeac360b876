package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fedstream/fedstream/federation/ledger"
)

// writeExport writes an honest two-org ledger export and the keys of
// both orgs, and returns the paths.
func writeExport(t *testing.T) (file, keys string, es []ledger.Entry) {
	t.Helper()
	apub, apriv, _ := ed25519.GenerateKey(rand.Reader)
	bpub, bpriv, _ := ed25519.GenerateKey(rand.Reader)
	at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	recs := []ledger.Record{
		{Kind: ledger.KindIdentity, ID: "identity-alpha", A: "alpha", Time: at, Fields: map[string]string{ledger.FieldKey: ledger.EncodePublicKey(apub)}},
		{Kind: ledger.KindContract, ID: "c1", Contract: "c1", A: "alpha", B: "beta", Time: at},
		{Kind: ledger.KindSettlement, ID: "s1", Contract: "c1", A: "alpha", B: "beta", Time: at.Add(time.Hour), Fields: map[string]string{"amount": "120"}},
	}
	for _, r := range recs {
		s := ledger.Signed{Record: r, Signatures: []ledger.Signature{ledger.Sign(r, "alpha", apriv)}}
		if ledger.CoSigned(r.Kind) {
			s.Signatures = append(s.Signatures, ledger.Sign(r, "beta", bpriv))
		}
		var prev *ledger.Entry
		if len(es) > 0 {
			prev = &es[len(es)-1]
		}
		es = append(es, ledger.Next(prev, s, "alpha", apriv))
	}
	dir := t.TempDir()
	file = filepath.Join(dir, "ledger.json")
	data, err := ledger.MarshalEntries(es)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	keys = filepath.Join(dir, "keys")
	if err := ledger.WriteKeyDir(keys, ledger.Keyring{"alpha": apub, "beta": bpub}); err != nil {
		t.Fatal(err)
	}
	return file, keys, es
}

func runCLI(args ...string) (string, error) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestLedgerVerifyOffline(t *testing.T) {
	file, keys, es := writeExport(t)
	out, err := runCLI("ledger", "verify", "--file", file, "--keys", keys, "--json")
	if err != nil {
		t.Fatalf("honest ledger: %v\n%s", err, out)
	}
	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep["valid"] != true || rep["entries"] != float64(3) || rep["first_bad"] != nil {
		t.Fatalf("report %v", rep)
	}

	// Alter the settlement's amount in the file.
	es[2].Record.Fields = map[string]string{"amount": "1"}
	data, _ := ledger.MarshalEntries(es)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI("ledger", "verify", "--file", file, "--keys", keys, "--json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("tampered ledger: err %v, want exit 1", err)
	}
	rep = nil
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep["valid"] != false || rep["first_bad"] != float64(3) {
		t.Fatalf("report %v", rep)
	}

	if _, err := runCLI("ledger", "verify", "--file", file); err == nil {
		t.Fatal("offline verify without keys accepted")
	}
}

func TestBalances(t *testing.T) {
	at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	es := []ledger.Entry{
		{Seq: 1, Signed: ledger.Signed{Record: ledger.Record{Kind: ledger.KindSettlement, ID: "s1", A: "alpha", B: "beta", Time: at, Fields: map[string]string{"amount": "100"}}}},
		{Seq: 2, Signed: ledger.Signed{Record: ledger.Record{Kind: ledger.KindSettlement, ID: "s2", A: "beta", B: "alpha", Time: at, Fields: map[string]string{"amount": "30"}}}},
		{Seq: 3, Signed: ledger.Signed{Record: ledger.Record{Kind: ledger.KindMove, ID: "m1", A: "alpha", B: "gamma", Time: at}}},
	}
	rows, err := balances("alpha", es)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Partner != "beta" || rows[0].OwedToPartner != 100 || rows[0].OwedByPartner != 30 || rows[0].Net != -70 {
		t.Fatalf("rows %+v", rows)
	}
	es[0].Record.Fields["amount"] = "lots"
	if _, err := balances("alpha", es); err == nil {
		t.Fatal("bad amount accepted")
	}
}

func TestLedgerListFilters(t *testing.T) {
	at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	mk := func(seq uint64, a, b string, off time.Duration) ledger.Entry {
		return ledger.Entry{Seq: seq, Signed: ledger.Signed{Record: ledger.Record{Kind: ledger.KindMove, ID: "m", A: a, B: b, Time: at.Add(off)}}}
	}
	es := []ledger.Entry{mk(1, "alpha", "", 0), mk(2, "alpha", "beta", time.Hour), mk(3, "gamma", "alpha", 2*time.Hour), mk(4, "beta", "alpha", 3*time.Hour)}
	seqs := func(es []ledger.Entry) (out []uint64) {
		for _, e := range es {
			out = append(out, e.Seq)
		}
		return out
	}
	for _, tc := range []struct {
		partner string
		since   time.Time
		want    []uint64
	}{
		{"", time.Time{}, []uint64{1, 2, 3, 4}},
		{"beta", time.Time{}, []uint64{2, 4}},
		{"", at.Add(2 * time.Hour), []uint64{3, 4}},
		{"beta", at.Add(2 * time.Hour), []uint64{4}},
		{"delta", time.Time{}, nil},
	} {
		got := seqs(filterEntries(es, tc.partner, tc.since))
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("partner %q since %v: %v, want %v", tc.partner, tc.since, got, tc.want)
		}
	}
	if got := filterEntries(es, "delta", time.Time{}); got == nil {
		t.Error("no match must be an empty list, not null")
	}
	now := at.Add(10 * time.Hour)
	if got, err := parseSince("24h", now); err != nil || !got.Equal(now.Add(-24*time.Hour)) {
		t.Errorf("24h: %v %v", got, err)
	}
	if got, err := parseSince("2026-05-01T10:00:00Z", now); err != nil || !got.Equal(at.Add(time.Hour)) {
		t.Errorf("RFC 3339: %v %v", got, err)
	}
	if _, err := parseSince("yesterday", now); err == nil {
		t.Error("bad --since accepted")
	}
}
