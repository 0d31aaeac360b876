package ledger

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type org struct {
	name string
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
}

func newOrg(t *testing.T, name string) org {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return org{name, priv, pub}
}

var at = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func sign(r Record, orgs ...org) Signed {
	s := Signed{Record: r}
	for _, o := range orgs {
		s.Signatures = append(s.Signatures, Sign(r, o.name, o.priv))
	}
	return s
}

// honest builds a's chain: its identity, a pin of b, a contract, a move, a
// return and a settlement.
func honest(t *testing.T, a, b org) ([]Entry, Keyring) {
	t.Helper()
	recs := []Signed{
		sign(Record{Kind: KindIdentity, ID: "identity", A: a.name, Time: at, Fields: map[string]string{FieldKey: EncodePublicKey(a.pub)}}, a),
		sign(Record{Kind: KindPin, ID: "pin-b", A: a.name, B: b.name, Time: at, Fields: map[string]string{FieldKey: EncodePublicKey(b.pub)}}, a),
		sign(Record{Kind: KindContract, ID: "c1", Contract: "c1", A: a.name, B: b.name, Time: at, Fields: map[string]string{"price_min": "10", "price_max": "40"}}, a, b),
		sign(Record{Kind: KindMove, ID: "m1", Contract: "c1", A: a.name, B: b.name, Time: at.Add(time.Minute), Fields: map[string]string{"tasks": "q/f/0/0", "price": "22.5"}}, a, b),
		sign(Record{Kind: KindReturn, ID: "r1", Contract: "c1", A: a.name, B: b.name, Time: at.Add(time.Hour), Fields: map[string]string{"tasks": "q/f/0/0"}}, a, b),
		sign(Record{Kind: KindSettlement, ID: "s1", Contract: "c1", A: a.name, B: b.name, Time: at.Add(time.Hour), Fields: map[string]string{"load_seconds": "3600", "amount": "81000"}}, a, b),
	}
	var es []Entry
	for _, s := range recs {
		var prev *Entry
		if len(es) > 0 {
			prev = &es[len(es)-1]
		}
		es = append(es, Next(prev, s, a.name, a.priv))
	}
	return es, Keyring{a.name: a.pub, b.name: b.pub}
}

func TestVerifyHonestChain(t *testing.T) {
	a, b := newOrg(t, "alpha"), newOrg(t, "beta")
	es, keys := honest(t, a, b)
	rep := Verify(es, keys)
	if !rep.Valid || rep.FirstBad != nil || rep.Entries != 6 {
		t.Fatalf("honest chain: %+v", rep)
	}
	// Through the export format too.
	data, err := MarshalEntries(es)
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalEntries(data)
	if err != nil {
		t.Fatal(err)
	}
	if rep := Verify(back, keys); !rep.Valid {
		t.Fatalf("after export and import: %+v", rep)
	}
}

func TestVerifyNamesFirstBadEntry(t *testing.T) {
	a, b, mallory := newOrg(t, "alpha"), newOrg(t, "beta"), newOrg(t, "mallory")
	for _, tc := range []struct {
		name    string
		tamper  func([]Entry) []Entry
		wantSeq uint64
		reason  string
	}{
		{"a field of a stored entry changed", func(es []Entry) []Entry {
			es[3].Record.Fields = map[string]string{"tasks": "q/f/0/0", "price": "2.5"}
			return es
		}, 4, "altered"},
		{"a stored entry changed and its hash recomputed", func(es []Entry) []Entry {
			es[3].Record.Fields = map[string]string{"tasks": "q/f/0/0", "price": "2.5"}
			es[3].Hash = es[3].ComputeHash()
			return es
		}, 4, "signature does not verify"},
		{"one signature altered", func(es []Entry) []Entry {
			es[2].Signatures[1].Sig = append([]byte(nil), es[2].Signatures[1].Sig...)
			es[2].Signatures[1].Sig[0] ^= 1
			return es
		}, 3, "altered"},
		{"one signature altered and the chain rehashed from there", func(es []Entry) []Entry {
			es[2].Signatures[1].Sig = append([]byte(nil), es[2].Signatures[1].Sig...)
			es[2].Signatures[1].Sig[0] ^= 1
			return rechain(es, a)
		}, 3, "beta's signature does not verify"},
		{"two entries swapped", func(es []Entry) []Entry {
			es[3], es[4] = es[4], es[3]
			return es
		}, 4, "seq is 5"},
		{"two entries swapped and the chain rehashed without the owner's key", func(es []Entry) []Entry {
			es[3], es[4] = es[4], es[3]
			return rehash(es)
		}, 4, "chain signature does not verify"},
		{"a stored entry changed and rehashed without the owner's key", func(es []Entry) []Entry {
			es[1].Record.Time = es[1].Record.Time.Add(time.Second)
			return rehash(es)
		}, 2, "chain signature does not verify"},
		{"entry removed", func(es []Entry) []Entry { return append(es[:2], es[3:]...) }, 3, "seq is 4"},
		{"missing signature", func(es []Entry) []Entry {
			es[3].Signatures = es[3].Signatures[:1]
			return rechain(es, a)
		}, 4, "carries 1 signatures, want 2"},
		{"forged signature by another key", func(es []Entry) []Entry {
			es[3].Signatures[1] = Sign(es[3].Record, "beta", mallory.priv)
			return rechain(es, a)
		}, 4, "beta's signature does not verify"},
		{"signature by the wrong org", func(es []Entry) []Entry {
			es[3].Signatures[1] = Sign(es[3].Record, "mallory", mallory.priv)
			return rechain(es, a)
		}, 4, `is by "mallory"`},
		{"identity claims another key", func(es []Entry) []Entry {
			r := es[0].Record
			r.Fields = map[string]string{FieldKey: EncodePublicKey(mallory.pub)}
			es[0].Signed = sign(r, a)
			return rechain(es, a)
		}, 1, "not the one the verifier holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es, keys := honest(t, a, b)
			es = tc.tamper(es)
			rep := Verify(es, keys)
			if tc.wantSeq == 0 {
				if !rep.Valid {
					t.Fatalf("want valid: %+v", rep)
				}
				return
			}
			if rep.Valid || rep.FirstBad == nil || *rep.FirstBad != tc.wantSeq {
				t.Fatalf("Verify = %+v, want first bad %d", rep, tc.wantSeq)
			}
			if !strings.Contains(rep.Reason, tc.reason) {
				t.Fatalf("reason %q does not say %q", rep.Reason, tc.reason)
			}
		})
	}
}

// rechain re-signs the chain with the owner's key: the owner itself
// rewriting its chain, used here to reach the record checks behind the
// chain signature. (Such a rewrite by the key holder verifies in
// isolation; the partner's copy of every co-signed record is what exposes
// it.)
func rechain(es []Entry, owner org) []Entry {
	for i := range es {
		var prev *Entry
		if i > 0 {
			prev = &es[i-1]
		}
		es[i] = Next(prev, es[i].Signed, owner.name, owner.priv)
	}
	return es
}

// rehash recomputes the hashes without the owner's key (keeping the old
// chain signatures), as someone who can write the store could.
func rehash(es []Entry) []Entry {
	for i := range es {
		es[i].Seq = uint64(i + 1)
		es[i].PrevHash = ""
		if i > 0 {
			es[i].PrevHash = es[i-1].Hash
		}
		es[i].Hash = es[i].ComputeHash()
	}
	return es
}

func TestVerifyUnknownKey(t *testing.T) {
	a, b := newOrg(t, "alpha"), newOrg(t, "beta")
	es, keys := honest(t, a, b)
	delete(keys, "beta")
	rep := Verify(es, keys)
	if rep.Valid || *rep.FirstBad != 3 || !strings.Contains(rep.Reason, `no public key for org "beta"`) {
		t.Fatalf("%+v", rep)
	}
}

func TestSignedVerifyRefusesForgeries(t *testing.T) {
	a, b, m := newOrg(t, "alpha"), newOrg(t, "beta"), newOrg(t, "mallory")
	keys := Keyring{"alpha": a.pub, "beta": b.pub}
	r := Record{Kind: KindContract, ID: "c1", A: "alpha", B: "beta", Time: at}
	for _, tc := range []struct {
		name string
		s    Signed
	}{
		{"only one party", sign(r, a)},
		{"no signature", Signed{Record: r}},
		{"forged by mallory", Signed{Record: r, Signatures: []Signature{Sign(r, "alpha", a.priv), Sign(r, "beta", m.priv)}}},
		{"parties swapped", Signed{Record: r, Signatures: []Signature{Sign(r, "beta", b.priv), Sign(r, "alpha", a.priv)}}},
		{"truncated signature", Signed{Record: r, Signatures: []Signature{Sign(r, "alpha", a.priv), {Org: "beta", Sig: []byte{1, 2}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.s.Verify(keys); !errors.Is(err, ErrSignature) {
				t.Fatalf("Verify = %v, want ErrSignature", err)
			}
		})
	}
	if err := sign(r, a, b).Verify(keys); err != nil {
		t.Fatalf("honest: %v", err)
	}
}

func TestCanonicalIsUnambiguous(t *testing.T) {
	r1 := Record{Kind: KindMove, ID: "ab", A: "c", B: "d", Time: at}
	r2 := Record{Kind: KindMove, ID: "a", A: "bc", B: "d", Time: at}
	if string(r1.Canonical()) == string(r2.Canonical()) {
		t.Fatal("shifting a byte between fields gives the same encoding")
	}
	f1 := Record{Kind: KindMove, ID: "x", A: "c", B: "d", Time: at, Fields: map[string]string{"k": "v=1"}}
	f2 := Record{Kind: KindMove, ID: "x", A: "c", B: "d", Time: at, Fields: map[string]string{"k=v": "1"}}
	if string(f1.Canonical()) == string(f2.Canonical()) {
		t.Fatal("fields k:'v=1' and 'k=v':'1' encode the same")
	}
	// Map order and time zone do not matter.
	g := Record{Kind: KindMove, ID: "x", A: "c", B: "d", Time: at.In(time.FixedZone("x", 3600)), Fields: map[string]string{"b": "2", "a": "1"}}
	h := Record{Kind: KindMove, ID: "x", A: "c", B: "d", Time: at, Fields: map[string]string{"a": "1", "b": "2"}}
	if string(g.Canonical()) != string(h.Canonical()) {
		t.Fatal("same record, different encodings")
	}
}

func TestSigningKeyFile(t *testing.T) {
	dir := t.TempDir()
	k1, created, err := LoadOrCreateSigningKey(dir)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	st, err := os.Stat(filepath.Join(dir, SigningKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %#o, want 0600", st.Mode().Perm())
	}
	k2, created, err := LoadOrCreateSigningKey(dir)
	if err != nil || created || !k1.Equal(k2) {
		t.Fatalf("reload: created %v, err %v, same %v", created, err, k1.Equal(k2))
	}
	if err := os.Chmod(filepath.Join(dir, SigningKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateSigningKey(dir); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("world-readable key: %v, want ErrKeyFile", err)
	}
	if err := os.WriteFile(filepath.Join(dir, SigningKeyFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, SigningKeyFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateSigningKey(dir); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("junk key: %v, want ErrKeyFile", err)
	}
}

func TestKeyDirRoundTrip(t *testing.T) {
	a, b := newOrg(t, "alpha"), newOrg(t, "beta")
	dir := t.TempDir()
	if err := WriteKeyDir(dir, Keyring{"alpha": a.pub, "beta": b.pub}); err != nil {
		t.Fatal(err)
	}
	keys, err := LoadKeyDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !keys["alpha"].Equal(a.pub) || !keys["beta"].Equal(b.pub) || len(keys) != 2 {
		t.Fatalf("keys %v", keys)
	}
	if _, err := LoadKeyDir(t.TempDir()); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("empty dir: %v", err)
	}
	if err := WriteKeyDir(dir, Keyring{"../x": a.pub}); err == nil {
		t.Fatal("path in org name accepted")
	}
}
