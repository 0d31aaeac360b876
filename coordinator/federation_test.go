package coordinator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation/ledger"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// A coordinator creates the org signing key at its first start (0600),
// records the public key as the ledger's first entry, and keeps both
// across a restart; auditors read and verify the ledger and may write
// nothing.
func TestOrgIdentityAndLedgerService(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "join-secret", "admin-secret")
	l := c.leader()
	keyPath := filepath.Join(c.cfgs[l].DataDir, ledger.SigningKeyFile)
	st, err := os.Stat(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %#o", st.Mode().Perm())
	}
	admin := pb.NewFederationServiceClient(c.conn(l, "admin-secret"))
	entries := func(fc pb.FederationServiceClient) []ledger.Entry {
		t.Helper()
		resp, err := fc.ListLedger(ctxT(t, 10*time.Second), &pb.ListLedgerRequest{})
		if err != nil {
			t.Fatal(err)
		}
		es, err := ledger.UnmarshalEntries(resp.EntriesJson)
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	waitFor(t, 15*time.Second, "the identity entry", func() bool { return len(entries(admin)) == 1 })
	es := entries(admin)
	if es[0].Record.Kind != ledger.KindIdentity || es[0].Record.A != "acme" {
		t.Fatalf("first entry %+v", es[0].Record)
	}

	tokens := pb.NewTokenServiceClient(c.conn(l, "admin-secret"))
	aud, err := tokens.CreateToken(ctxT(t, 10*time.Second), &pb.CreateTokenRequest{Role: "auditor", Description: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	auditor := pb.NewFederationServiceClient(c.conn(l, aud.Secret))
	if got := entries(auditor); len(got) != 1 {
		t.Fatalf("auditor sees %d entries", len(got))
	}
	vr, err := auditor.VerifyLedger(ctxT(t, 10*time.Second), &pb.VerifyLedgerRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var rep ledger.Report
	if err := json.Unmarshal(vr.ReportJson, &rep); err != nil || !rep.Valid || rep.Entries != 1 {
		t.Fatalf("verify: %s %v", vr.ReportJson, err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	enc := ledger.EncodePublicKey(pub)
	// Every write is refused for the auditor.
	for name, call := range map[string]func() error{
		"pin": func() error {
			_, err := auditor.PinKey(ctxT(t, 5*time.Second), &pb.PinKeyRequest{Org: "beta", Key: enc})
			return err
		},
		"propose": func() error {
			_, err := auditor.ProposeContract(ctxT(t, 5*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 1, ValidForMs: 60000})
			return err
		},
		"accept": func() error {
			_, err := auditor.AnswerContract(ctxT(t, 5*time.Second), &pb.AnswerContractRequest{Id: "c-1", Accept: true})
			return err
		},
		"terminate": func() error {
			_, err := auditor.TerminateContract(ctxT(t, 5*time.Second), &pb.TerminateContractRequest{Id: "c-1"})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("auditor %s: %v, want PermissionDenied", name, err)
		}
	}
	if n := len(entries(admin)); n != 1 {
		t.Fatalf("auditor writes changed the ledger: %d entries", n)
	}

	// The admin pins a partner key; a proposal names the missing link
	// (no cross-org connection yet) rather than pretending.
	if _, err := admin.PinKey(ctxT(t, 10*time.Second), &pb.PinKeyRequest{Org: "beta", Key: enc}); err != nil {
		t.Fatal(err)
	}
	_, err = admin.ProposeContract(ctxT(t, 10*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 1, ValidForMs: 60000})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "unknown org") {
		t.Fatalf("propose without a route: %v", err)
	}
	_, err = admin.ProposeContract(ctxT(t, 10*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 3, PriceMax: 2, MaxLoad: 1, ValidForMs: 60000})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "p_min 3 is above p_max 2") {
		t.Fatalf("bad terms: %v", err)
	}

	// Restart: same key, no second identity, ledger still valid.
	c.stop(l)
	c.start(l)
	l = c.leader()
	admin = pb.NewFederationServiceClient(c.conn(l, "admin-secret"))
	waitFor(t, 15*time.Second, "the ledger after restart", func() bool {
		resp, err := admin.VerifyLedger(ctxT(t, 5*time.Second), &pb.VerifyLedgerRequest{})
		if err != nil {
			return false
		}
		var r ledger.Report
		return json.Unmarshal(resp.ReportJson, &r) == nil && r.Valid && r.Entries == 2
	})
	if es := entries(admin); es[0].Record.Kind != ledger.KindIdentity || es[1].Record.Kind != ledger.KindPin {
		t.Fatalf("after restart: %v, %v", es[0].Record.Kind, es[1].Record.Kind)
	}
}

// Three coordinators start with three keys of their own; once the first
// leader records its key as the org's identity, the others fetch it over
// mutual TLS, so whichever coordinator leads later signs as the org.
func TestCoordinatorsShareTheOrgKey(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, "join-secret", "admin-secret")
	l := c.leader()
	var want ed25519.PublicKey
	waitFor(t, 20*time.Second, "the org identity", func() bool {
		k, ok, err := c.nodes[l].fed.IdentityKey()
		want = k
		return err == nil && ok
	})
	waitFor(t, 30*time.Second, "every coordinator holding the org key", func() bool {
		for i, n := range c.nodes {
			if !n.fed.PublicKey().Equal(want) {
				return false
			}
			k, created, err := ledger.LoadOrCreateSigningKey(c.cfgs[i].DataDir)
			if err != nil || created || !k.Public().(ed25519.PublicKey).Equal(want) {
				return false
			}
		}
		return true
	})
	c.stop(l)
	nl := c.leader()
	admin := pb.NewFederationServiceClient(c.conn(nl, "admin-secret"))
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	// Retried while Unavailable (pinning the same key again changes
	// nothing): the two remaining nodes may change leadership again on a
	// loaded machine.
	if err := whileUnavailable(t, func(ctx context.Context) error {
		_, err := admin.PinKey(ctx, &pb.PinKeyRequest{Org: "beta", Key: ledger.EncodePublicKey(pub)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var resp *pb.VerifyLedgerResponse
	if err := whileUnavailable(t, func(ctx context.Context) (err error) {
		resp, err = admin.VerifyLedger(ctx, &pb.VerifyLedgerRequest{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var rep ledger.Report
	if err := json.Unmarshal(resp.ReportJson, &rep); err != nil || !rep.Valid || rep.Entries != 2 {
		t.Fatalf("ledger after a leader change: %s", resp.ReportJson)
	}
}
