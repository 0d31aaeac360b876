package federation

import (
	"context"
	"errors"
	"testing"

	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// A partner's CA is pinned with its key, only if it is a CA of that org,
// never replaced, and stays verifiable in the ledger.
func TestPinWithCA(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a := f.orgs["alpha"]
	betaKey := f.orgs["beta"].PublicKey()
	newCA := func(org string) []byte {
		ca, err := tlsutil.NewCA(org)
		if err != nil {
			t.Fatal(err)
		}
		return ca.CertPEM
	}
	betaCA, otherBetaCA, gammaCA := newCA("beta"), newCA("beta"), newCA("gamma")

	if _, ok, _ := a.PinnedCA("beta"); ok {
		t.Fatal("a CA pinned before any pin")
	}
	// A key pinned alone first (as before CAs existed), then the CA.
	if err := a.Pin(ctx, "beta", betaKey); err != nil {
		t.Fatal(err)
	}
	if err := a.PinWithCA(ctx, "beta", betaKey, gammaCA); !errors.Is(err, ErrBadCA) {
		t.Fatalf("gamma's CA as beta's: %v", err)
	}
	if err := a.PinWithCA(ctx, "beta", betaKey, []byte("not a certificate")); !errors.Is(err, ErrBadCA) {
		t.Fatalf("garbage as a CA: %v", err)
	}
	if err := a.PinWithCA(ctx, "beta", betaKey, betaCA); err != nil {
		t.Fatal(err)
	}
	got, ok, err := a.PinnedCA("beta")
	if err != nil || !ok || string(got) != string(betaCA) {
		t.Fatalf("pinned CA %v %v", ok, err)
	}
	n := len(mustEntries(t, a))
	// The same again: nothing new. Another CA of beta, or another key: refused.
	if err := a.PinWithCA(ctx, "beta", betaKey, betaCA); err != nil || len(mustEntries(t, a)) != n {
		t.Fatalf("re-pinning the same CA: %v, %d entries (was %d)", err, len(mustEntries(t, a)), n)
	}
	if err := a.PinWithCA(ctx, "beta", betaKey, otherBetaCA); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("another beta CA: %v", err)
	}
	if err := a.PinWithCA(ctx, "beta", f.orgs["alpha"].PublicKey(), betaCA); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("another key with the pinned CA: %v", err)
	}
	if got, _, _ := a.PinnedCA("beta"); string(got) != string(betaCA) {
		t.Fatal("the pinned CA changed")
	}
	if rep, err := a.Verify(); err != nil || !rep.Valid {
		t.Fatalf("ledger with CA pins: %+v %v", rep, err)
	}
	keys, _ := a.Keys()
	if !keys["beta"].Equal(betaKey) {
		t.Fatal("beta's key lost")
	}
	// Key and CA together in one record for an org pinned for the first time.
	f2 := newFed(t, "alpha", "beta")
	if err := f2.orgs["alpha"].PinWithCA(ctx, "beta", f2.orgs["beta"].PublicKey(), betaCA); err != nil {
		t.Fatal(err)
	}
	es := mustEntries(t, f2.orgs["alpha"])
	if last := es[len(es)-1].Record; last.Kind != ledger.KindPin || last.Fields[FieldCA] == "" || last.Fields[ledger.FieldKey] == "" {
		t.Fatalf("pin record %+v", last)
	}
}

func mustEntries(t *testing.T, o *Org) []ledger.Entry {
	t.Helper()
	es, err := o.Entries()
	if err != nil {
		t.Fatal(err)
	}
	return es
}
