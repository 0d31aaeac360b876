package coordinator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// withToken is the incoming context of a call carrying a bearer token.
func withToken(token string) context.Context {
	if token == "" {
		return context.Background()
	}
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
}

// tokenState is an FSM holding the given tokens, created at t0.
func tokenState(t *testing.T, toks ...fsm.Token) *fsm.FSM {
	t.Helper()
	f, err := fsm.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range toks {
		data, err := fsm.Encode(fsm.CreateTokenType, fsm.CreateTokenRequest{Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		if res := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: data}).(*fsm.ApplyResult); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	return f
}

func TestAuthenticatorRoleTable(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tok := func(id, secret, role string, ttl time.Duration) fsm.Token {
		tk := fsm.NewToken(id, secret, role, "")
		tk.CreatedUnixMs = t0.UnixMilli()
		if ttl > 0 {
			tk.ExpiresUnixMs = t0.Add(ttl).UnixMilli()
		}
		return tk
	}
	f := tokenState(t,
		tok("t-admin", "admin-raft-secret", fsm.RoleAdmin, 0),
		tok("t-writer", "writer-secret", fsm.RoleWriter, 0),
		tok("t-reader", "reader-secret", fsm.RoleReader, 0),
		tok("t-auditor", "auditor-secret", fsm.RoleAuditor, 0),
		tok("t-short", "short-secret", fsm.RoleReader, time.Minute),
	)
	a := newAuthenticator("acme", "join-secret", "admin-secret", f.State)
	a.now = func() time.Time { return t0.Add(2 * time.Minute) } // t-short has expired
	var identity *rpc.Identity
	a.peerIdentity = func(context.Context) (rpc.Identity, bool) {
		if identity == nil {
			return rpc.Identity{}, false
		}
		return *identity, true
	}
	const (
		status_    = pb.AdminService_Status_FullMethodName
		listQ      = pb.AdminService_ListQueries_FullMethodName
		getQ       = pb.AdminService_GetQuery_FullMethodName
		submit     = pb.AdminService_SubmitQuery_FullMethodName
		stop       = pb.AdminService_StopQuery_FullMethodName
		register   = pb.WorkerService_Register_FullMethodName
		heartbeat  = pb.WorkerService_Heartbeat_FullMethodName
		create     = pb.TokenService_CreateToken_FullMethodName
		revoke     = pb.TokenService_RevokeToken_FullMethodName
		authorize  = pb.TokenService_AuthorizeToken_FullMethodName
		health     = healthpb.Health_Check_FullMethodName
		notInTable = "/fedstream.v1.AdminService/DropEverything"
		ledgerList = pb.FederationService_ListLedger_FullMethodName
		ledgerVer  = pb.FederationService_VerifyLedger_FullMethodName
		contracts  = pb.FederationService_ListContracts_FullMethodName
		propose    = pb.FederationService_ProposeContract_FullMethodName
		answer     = pb.FederationService_AnswerContract_FullMethodName
		terminate  = pb.FederationService_TerminateContract_FullMethodName
		pin        = pb.FederationService_PinKey_FullMethodName
	)
	cases := []struct {
		name     string
		token    string
		identity *rpc.Identity
		method   string
		want     codes.Code
		// wantMsg are substrings of the error message.
		wantMsg []string
	}{
		{name: "no token", method: listQ, want: codes.Unauthenticated, wantMsg: []string{"missing token", "role reader", "--token-file", "FEDSTREAM_TOKEN"}},
		{name: "health needs nothing", method: health, want: codes.OK},
		{name: "method missing from the table", token: "admin-secret", method: notInTable, want: codes.PermissionDenied, wantMsg: []string{"role table"}},
		{name: "wrong token", token: "guess", method: listQ, want: codes.PermissionDenied, wantMsg: []string{"wrong token", "role reader"}},
		{name: "expired token", token: "short-secret", method: listQ, want: codes.PermissionDenied, wantMsg: []string{"expired", "t-short"}},

		{name: "config admin may submit", token: "admin-secret", method: submit, want: codes.OK},
		{name: "config admin may create tokens", token: "admin-secret", method: create, want: codes.OK},
		{name: "admin is not a worker", token: "admin-secret", method: register, want: codes.PermissionDenied, wantMsg: []string{"role is admin", "worker role"}},
		{name: "raft admin may revoke tokens", token: "admin-raft-secret", method: revoke, want: codes.OK},

		{name: "writer may submit", token: "writer-secret", method: submit, want: codes.OK},
		{name: "writer may stop", token: "writer-secret", method: stop, want: codes.OK},
		{name: "writer may read", token: "writer-secret", method: getQ, want: codes.OK},
		{name: "writer may not create tokens", token: "writer-secret", method: create, want: codes.PermissionDenied, wantMsg: []string{"role is writer", "role admin"}},

		{name: "reader may read", token: "reader-secret", method: getQ, want: codes.OK},
		{name: "reader may see status", token: "reader-secret", method: status_, want: codes.OK},
		{name: "reader may not submit", token: "reader-secret", method: submit, want: codes.PermissionDenied, wantMsg: []string{"role is reader", "role writer"}},
		{name: "reader may not register", token: "reader-secret", method: register, want: codes.PermissionDenied, wantMsg: []string{"worker role"}},

		{name: "auditor may see status", token: "auditor-secret", method: status_, want: codes.OK},
		{name: "auditor may not list queries", token: "auditor-secret", method: listQ, want: codes.PermissionDenied},
		{name: "auditor may read the ledger", token: "auditor-secret", method: ledgerList, want: codes.OK},
		{name: "auditor may verify the ledger", token: "auditor-secret", method: ledgerVer, want: codes.OK},
		{name: "auditor may list contracts", token: "auditor-secret", method: contracts, want: codes.OK},
		{name: "auditor may not propose a contract", token: "auditor-secret", method: propose, want: codes.PermissionDenied, wantMsg: []string{"role is auditor", "role admin"}},
		{name: "auditor may not accept a contract", token: "auditor-secret", method: answer, want: codes.PermissionDenied, wantMsg: []string{"role is auditor"}},
		{name: "auditor may not terminate a contract", token: "auditor-secret", method: terminate, want: codes.PermissionDenied, wantMsg: []string{"role is auditor"}},
		{name: "auditor may not pin a key", token: "auditor-secret", method: pin, want: codes.PermissionDenied, wantMsg: []string{"role is auditor"}},
		{name: "writer may not propose a contract", token: "writer-secret", method: propose, want: codes.PermissionDenied, wantMsg: []string{"role is writer", "role admin"}},
		{name: "raft admin may propose a contract", token: "admin-raft-secret", method: propose, want: codes.OK},

		{name: "join token may register", token: "join-secret", method: register, want: codes.OK},
		{name: "join token may authorize tokens", token: "join-secret", method: authorize, want: codes.OK},
		{name: "join token may not list queries", token: "join-secret", method: listQ, want: codes.PermissionDenied, wantMsg: []string{"role is worker"}},

		{name: "worker certificate may heartbeat", identity: &rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-1"}, method: heartbeat, want: codes.OK},
		{name: "worker certificate may not submit", identity: &rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-1"}, method: submit, want: codes.Unauthenticated},
		{name: "other org's worker certificate", identity: &rpc.Identity{Org: "evil", Role: rpc.RoleWorker, Name: "w-1"}, method: heartbeat, want: codes.Unauthenticated},
		{name: "client certificate is not a worker", identity: &rpc.Identity{Org: "acme", Role: rpc.RoleClient, Name: "ops"}, method: heartbeat, want: codes.Unauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			identity = tc.identity
			err := a.check(withToken(tc.token), tc.method)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %s (%v), want %s", got, err, tc.want)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if tc.token != "" && err != nil && strings.Contains(err.Error(), tc.token) {
				t.Errorf("error echoes the secret: %v", err)
			}
		})
	}

	dev := newAuthenticator("acme", "", "", f.State)
	for _, m := range []string{submit, create, register} {
		if err := dev.check(context.Background(), m); err != nil {
			t.Errorf("dev mode refused %s: %v", m, err)
		}
	}
}

// TestTokensInCluster creates, uses, lists and revokes tokens through a
// three-node cluster, talking to a follower (writes are forwarded).
func TestTokensInCluster(t *testing.T) {
	// Not parallel: its calls through a follower do not retry, and beside
	// the others a loaded machine changed leaders under one ("leadership
	// changed while the call was being forwarded").
	c := newTestCluster(t, 3, "join-secret", "admin-secret")
	f := c.follower()
	tokens := pb.NewTokenServiceClient(c.conn(f, "admin-secret"))

	create := func(role string, ttl time.Duration, key, secret string) (*pb.CreateTokenResponse, error) {
		return tokens.CreateToken(ctxT(t, 10*time.Second), &pb.CreateTokenRequest{Role: role, TtlMs: ttl.Milliseconds(), Description: role + " for tests", IdempotencyKey: key, Secret: secret})
	}
	reader, err := create("reader", 0, "k-reader", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reader.Secret, "fst_") || reader.Token.Role != "reader" || reader.Token.Id == "" || reader.Token.ExpiresUnixMs != 0 {
		t.Fatalf("created %+v", reader)
	}
	// A retry with the same key and secret is the same token; with another
	// secret it is refused rather than returning a secret that does not work.
	if again, err := create("reader", 0, "k-reader", reader.Secret); err != nil || again.Token.Id != reader.Token.Id {
		t.Fatalf("retry: %+v, %v", again, err)
	}
	if _, err := create("reader", 0, "k-reader", "another-secret-0123456789"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("same key, other secret: %v", err)
	}
	if _, err := create("root", 0, "", ""); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown role") {
		t.Fatalf("bad role: %v", err)
	}
	writer, err := create("writer", 0, "", "")
	if err != nil {
		t.Fatal(err)
	}

	// The follower that forwarded the creation knows the token when it
	// answers: it works there at once.
	readerAdmin := pb.NewAdminServiceClient(c.conn(f, reader.Secret))
	if _, err := readerAdmin.ListQueries(ctxT(t, 5*time.Second), &pb.ListQueriesRequest{}); err != nil {
		t.Fatalf("a new token on the follower that created it: %v", err)
	}
	_, err = readerAdmin.SubmitQuery(ctxT(t, 5*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(wordsQuery, "q", 1)), Filename: "q.yaml"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "role is reader") || !strings.Contains(err.Error(), "role writer") {
		t.Fatalf("reader submitted: %v", err)
	}
	writerAdmin := pb.NewAdminServiceClient(c.conn(f, writer.Secret))
	// Made again while Unavailable (leadership lost under it on a loaded
	// machine): stopping a query that does not exist changes nothing.
	if err := whileUnavailable(t, func(ctx context.Context) error {
		_, err := writerAdmin.StopQuery(ctx, &pb.StopQueryRequest{Name: "nope"})
		return err
	}); status.Code(err) != codes.NotFound {
		t.Fatalf("writer stop: %v, want NotFound (authorised, and there is no such query)", err)
	}
	if _, err := pb.NewTokenServiceClient(c.conn(f, writer.Secret)).ListTokens(ctxT(t, 5*time.Second), &pb.ListTokensRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("writer listed tokens: %v", err)
	}

	// Workers ask about tokens by hash.
	authz := pb.NewTokenServiceClient(c.conn(f, "join-secret"))
	got, err := authz.AuthorizeToken(ctxT(t, 5*time.Second), &pb.AuthorizeTokenRequest{TokenHash: fsm.HashSecret(reader.Secret)})
	if err != nil || got.Role != "reader" {
		t.Fatalf("authorize reader: %+v, %v", got, err)
	}
	if _, err := authz.AuthorizeToken(ctxT(t, 5*time.Second), &pb.AuthorizeTokenRequest{TokenHash: fsm.HashSecret("nobody-has-this")}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("authorize unknown: %v", err)
	}

	list, err := tokens.ListTokens(ctxT(t, 5*time.Second), &pb.ListTokensRequest{})
	if err != nil || len(list.Tokens) != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	for _, ti := range list.Tokens {
		if strings.Contains(ti.String(), reader.Secret) || strings.Contains(ti.String(), writer.Secret) || strings.Contains(ti.String(), fsm.HashSecret(reader.Secret)) {
			t.Fatalf("list shows a secret or its hash: %v", ti)
		}
	}

	// Revocation: refused from then on, on every node.
	if _, err := tokens.RevokeToken(ctxT(t, 10*time.Second), &pb.RevokeTokenRequest{Id: reader.Token.Id, IdempotencyKey: "rv"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.RevokeToken(ctxT(t, 10*time.Second), &pb.RevokeTokenRequest{Id: reader.Token.Id}); status.Code(err) != codes.NotFound {
		t.Fatalf("revoke twice: %v", err)
	}
	if _, err := readerAdmin.ListQueries(ctxT(t, 5*time.Second), &pb.ListQueriesRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a revoked token on the follower that revoked it: %v", err)
	}
	for i := range c.nodes {
		cl := pb.NewAdminServiceClient(c.conn(i, reader.Secret))
		waitUntil(t, 10*time.Second, "the revoked token is refused", func() bool {
			_, err := cl.ListQueries(ctxT(t, 5*time.Second), &pb.ListQueriesRequest{})
			return status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "wrong token")
		})
	}

	// A token with a TTL stops working when it expires.
	short, err := create("reader", 300*time.Millisecond, "", "")
	if err != nil {
		t.Fatal(err)
	}
	shortAdmin := pb.NewAdminServiceClient(c.conn(c.leader(), short.Secret))
	waitUntil(t, 10*time.Second, "the short-lived token expires", func() bool {
		_, err := shortAdmin.ListQueries(ctxT(t, 5*time.Second), &pb.ListQueriesRequest{})
		return status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "expired")
	})
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
