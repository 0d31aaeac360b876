package authz

import (
	"errors"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// services is every service a fedstream process registers.
var services = []grpc.ServiceDesc{
	pb.WorkerService_ServiceDesc,
	pb.AdminService_ServiceDesc,
	pb.TokenService_ServiceDesc,
	pb.DataPlane_ServiceDesc,
	pb.CoordinatorPeerService_ServiceDesc,
	pb.FederationService_ServiceDesc,
	pb.OrgKeyService_ServiceDesc,
	pb.FederationPeerService_ServiceDesc,
	healthpb.Health_ServiceDesc,
	reflectionv1.ServerReflection_ServiceDesc,
	reflectionv1alpha.ServerReflection_ServiceDesc,
}

func TestEveryMethodHasANeed(t *testing.T) {
	listed := map[string]bool{}
	for _, sd := range services {
		names := []string{}
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, name := range names {
			full := "/" + sd.ServiceName + "/" + name
			listed[full] = true
			if _, err := MethodNeed(full); err != nil {
				t.Errorf("%s is not in the role table: add it to authz.Methods", full)
			}
		}
	}
	for m := range Methods {
		if !listed[m] {
			t.Errorf("role table lists %s, which no service has (renamed? add its service to this test)", m)
		}
	}
	if _, err := MethodNeed("/fedstream.v1.AdminService/Nope"); !errors.Is(err, ErrMethodNotInTable) {
		t.Fatalf("unknown method: %v", err)
	}
}

func TestRoleTable(t *testing.T) {
	// For each method, which roles may call it.
	type row struct {
		method                                        string
		admin, worker, writer, reader, auditor, noone bool
	}
	rows := []row{
		{method: pb.WorkerService_Register_FullMethodName, worker: true},
		{method: pb.WorkerService_WatchAssignments_FullMethodName, worker: true},
		{method: pb.TokenService_AuthorizeToken_FullMethodName, worker: true},
		{method: pb.AdminService_Status_FullMethodName, admin: true, writer: true, reader: true, auditor: true},
		{method: pb.AdminService_ListQueries_FullMethodName, admin: true, writer: true, reader: true},
		{method: pb.AdminService_GetQuery_FullMethodName, admin: true, writer: true, reader: true},
		{method: pb.AdminService_ListWorkers_FullMethodName, admin: true, writer: true, reader: true},
		{method: pb.AdminService_SubmitQuery_FullMethodName, admin: true, writer: true},
		{method: pb.AdminService_StopQuery_FullMethodName, admin: true, writer: true},
		{method: pb.TokenService_CreateToken_FullMethodName, admin: true},
		{method: pb.TokenService_ListTokens_FullMethodName, admin: true},
		{method: pb.TokenService_RevokeToken_FullMethodName, admin: true},
		{method: pb.DataPlane_Subscribe_FullMethodName, admin: true, worker: true, writer: true, reader: true},
		{method: pb.DataPlane_Ingest_FullMethodName, admin: true, writer: true},
		{method: pb.DataPlane_IngestSession_FullMethodName, admin: true, writer: true},
		// Federation: auditors read and verify; every write is an admin's.
		{method: pb.FederationService_ListLedger_FullMethodName, admin: true, writer: true, reader: true, auditor: true},
		{method: pb.FederationService_VerifyLedger_FullMethodName, admin: true, writer: true, reader: true, auditor: true},
		{method: pb.FederationService_ListContracts_FullMethodName, admin: true, writer: true, reader: true, auditor: true},
		{method: pb.FederationService_ProposeContract_FullMethodName, admin: true},
		{method: pb.FederationService_AnswerContract_FullMethodName, admin: true},
		{method: pb.FederationService_TerminateContract_FullMethodName, admin: true},
		{method: pb.FederationService_PinKey_FullMethodName, admin: true},
		// No token role at all: a coordinator certificate.
		{method: pb.CoordinatorPeerService_RaftState_FullMethodName},
		{method: pb.OrgKeyService_FetchOrgKey_FullMethodName},
		{method: healthpb.Health_Check_FullMethodName, admin: true, worker: true, writer: true, reader: true, auditor: true, noone: true},
	}
	for _, r := range rows {
		need, err := MethodNeed(r.method)
		if err != nil {
			t.Fatal(err)
		}
		for role, want := range map[Role]bool{RoleAdmin: r.admin, RoleWorker: r.worker, RoleWriter: r.writer, RoleReader: r.reader, RoleAuditor: r.auditor, Role(""): r.noone} {
			if got := role.Allows(need); got != want {
				t.Errorf("%s: role %q allowed = %v, want %v (need: %s)", r.method, role, got, want, need)
			}
		}
	}
}

func TestParseRole(t *testing.T) {
	for _, r := range TokenRoles {
		if got, err := ParseRole(string(r)); err != nil || got != r {
			t.Errorf("ParseRole(%q) = %q, %v", r, got, err)
		}
	}
	for _, bad := range []string{"", "root", "Admin"} {
		if _, err := ParseRole(bad); !errors.Is(err, ErrUnknownRole) {
			t.Errorf("ParseRole(%q): %v, want ErrUnknownRole", bad, err)
		}
	}
}
