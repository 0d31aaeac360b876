// Package authz is the one place that says who may call what: the roles a
// caller can hold, and the table of what every gRPC method of every
// fedstream service requires. Coordinators and workers both enforce it; a
// test fails when a method of a service is missing from the table, and an
// enforcing server refuses a method it does not find here.
package authz

import (
	"errors"
	"fmt"
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Role is what a credential lets its holder do.
//
// admin > writer > reader: each includes the ones after it. auditor stands
// apart: it may call Status and read and verify the federation ledger and
// contracts, and nothing else (no query, worker or token call, no write). worker is the role of the
// org's own worker processes (the join token, a token created with role
// worker, or, with mutual TLS, a worker certificate of the org): it covers
// the worker protocol and acknowledging data-plane subscriptions, and no
// client call. admin may call everything except what needs the worker
// role: an admin is a person, and a worker's calls (registering, reporting
// task states, acknowledging tuples on behalf of a task) are only right
// when a worker makes them.
type Role string

// Roles.
const (
	RoleAdmin   Role = "admin"
	RoleWriter  Role = "writer"
	RoleReader  Role = "reader"
	RoleAuditor Role = "auditor"
	RoleWorker  Role = "worker"
)

// TokenRoles are the roles a token stored in the org's state may carry.
var TokenRoles = []Role{RoleAdmin, RoleWriter, RoleReader, RoleAuditor, RoleWorker}

// ErrUnknownRole is returned by ParseRole for a name that is not a role.
var ErrUnknownRole = errors.New("unknown role")

// ParseRole checks a role name.
func ParseRole(s string) (Role, error) {
	for _, r := range TokenRoles {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, len(TokenRoles))
	for i, r := range TokenRoles {
		names[i] = string(r)
	}
	return "", fmt.Errorf("%w %q: want one of %s", ErrUnknownRole, s, strings.Join(names, ", "))
}

// Need is what a method requires of its caller.
type Need uint8

// Needs, from none to the most privileged.
const (
	// NeedNone: anyone (health checks).
	NeedNone Need = iota
	// NeedWorker: one of the org's workers (not even an admin).
	NeedWorker
	// NeedStatus: any client role, auditor included (status, and reading
	// the federation ledger and contracts).
	NeedStatus
	// NeedReader: reader or above.
	NeedReader
	// NeedSubscriber: a worker, or a reader or above. Data-plane
	// subscriptions; the worker further requires the worker role for a
	// subscription that acknowledges (holds back the buffer).
	NeedSubscriber
	// NeedWriter: writer or admin.
	NeedWriter
	// NeedAdmin: admin only.
	NeedAdmin
	// NeedCoordinator: another coordinator of the org, proven by its
	// coordinator certificate under mutual TLS. No token grants it, not
	// even admin: these calls are between the org's coordinators only.
	// (In plaintext mode nothing can be proven and the coordinator lets
	// any caller make them, as its Raft port does.)
	NeedCoordinator
)

// String describes the need for error messages.
func (n Need) String() string {
	switch n {
	case NeedNone:
		return "no credential"
	case NeedWorker:
		return "the worker role (the org's join token or a worker certificate)"
	case NeedStatus:
		return "a token with role auditor, reader, writer or admin"
	case NeedReader:
		return "a token with role reader (or writer or admin)"
	case NeedSubscriber:
		return "a token with role reader (or writer or admin), or the worker role"
	case NeedWriter:
		return "a token with role writer (or admin)"
	case NeedAdmin:
		return "a token with role admin"
	case NeedCoordinator:
		return "a coordinator certificate of the org"
	}
	return fmt.Sprintf("Need(%d)", uint8(n))
}

// Allows reports whether a caller holding role r may call a method that
// needs n.
func (r Role) Allows(n Need) bool {
	switch n {
	case NeedNone:
		return true
	case NeedWorker:
		return r == RoleWorker
	case NeedCoordinator:
		return false // a certificate, never a token role
	}
	if r == RoleAdmin {
		return true
	}
	switch n {
	case NeedStatus:
		return r == RoleAuditor || r == RoleReader || r == RoleWriter
	case NeedReader:
		return r == RoleReader || r == RoleWriter
	case NeedSubscriber:
		return r == RoleWorker || r == RoleReader || r == RoleWriter
	case NeedWriter:
		return r == RoleWriter
	}
	return false
}

// Methods is the role table: the need of every method of every service a
// fedstream process serves, by full gRPC method name. Add a method here in
// the same change that adds it to the proto; TestEveryMethodHasANeed
// fails otherwise, and servers refuse methods missing from it.
var Methods = map[string]Need{
	// Workers talk to coordinators.
	pb.WorkerService_Register_FullMethodName:         NeedWorker,
	pb.WorkerService_Heartbeat_FullMethodName:        NeedWorker,
	pb.WorkerService_WatchAssignments_FullMethodName: NeedWorker,
	pb.WorkerService_ReportTasks_FullMethodName:      NeedWorker,
	pb.WorkerService_NoteReconfigAcks_FullMethodName: NeedWorker,
	// A worker renews the certificate the coordinators signed for it.
	pb.WorkerService_RenewCertificate_FullMethodName: NeedWorker,

	// Clients talk to coordinators.
	pb.AdminService_Status_FullMethodName:      NeedStatus,
	pb.AdminService_ListWorkers_FullMethodName: NeedReader,
	pb.AdminService_ListQueries_FullMethodName: NeedReader,
	pb.AdminService_GetQuery_FullMethodName:    NeedReader,
	pb.AdminService_SubmitQuery_FullMethodName: NeedWriter,
	pb.AdminService_StopQuery_FullMethodName:   NeedWriter,
	// Moving a running task changes placements, as submitting does.
	pb.AdminService_MoveTask_FullMethodName:   NeedWriter,
	pb.AdminService_QueryStats_FullMethodName: NeedReader,
	// Rescaling a query changes placements and slot maps.
	pb.AdminService_ScaleQuery_FullMethodName: NeedWriter,
	// Live reconfiguration (issue 13): a plan changes what a query runs.
	pb.ReconfigService_UpdateQuery_FullMethodName:   NeedWriter,
	pb.ReconfigService_QueryVersions_FullMethodName: NeedReader,
	// Cross-org migration (issue 11 item 6): load moved to a partner is
	// paid for under a contract, so it is the contract writers' (admin).
	pb.AdminService_MigrateTask_FullMethodName: NeedAdmin,
	pb.AdminService_ReturnTask_FullMethodName:  NeedAdmin,
	// The health manager's action log and blacklist are read-only views.
	pb.HealthService_Actions_FullMethodName:   NeedReader,
	pb.HealthService_Blacklist_FullMethodName: NeedReader,

	// Raft membership: anyone who may read the org may see it; only an
	// admin may change it.
	pb.AdminService_ListRaftPeers_FullMethodName:  NeedReader,
	pb.AdminService_RemoveRaftPeer_FullMethodName: NeedAdmin,

	// Tokens: administered by admins, checked by workers.
	pb.TokenService_CreateToken_FullMethodName:    NeedAdmin,
	pb.TokenService_ListTokens_FullMethodName:     NeedAdmin,
	pb.TokenService_RevokeToken_FullMethodName:    NeedAdmin,
	pb.TokenService_AuthorizeToken_FullMethodName: NeedWorker,

	// Tasks and clients talk to workers.
	pb.DataPlane_Subscribe_FullMethodName: NeedSubscriber,
	pb.DataPlane_Ingest_FullMethodName:    NeedWriter,
	// Resumable ingest (issue 9 item 3): the same lines, acknowledged.
	pb.DataPlane_IngestSession_FullMethodName: NeedWriter,
	// A task's state goes only to another worker of the org (a move, a
	// replica bootstrapping from its peer).
	pb.DataPlane_FetchSnapshot_FullMethodName: NeedWorker,
	// DCAA permission between peer replicas: workers only.
	pb.DataPlane_Reconcile_FullMethodName: NeedWorker,
	// Slot state handed over in a rescale: the org's workers only.
	pb.DataPlane_FetchSlots_FullMethodName: NeedWorker,

	// Federation (issue 11): auditors (and every client role) read and
	// verify the ledger and the contracts; only an admin proposes,
	// answers or terminates a contract, or pins a partner's key.
	pb.FederationService_ListLedger_FullMethodName:        NeedStatus,
	pb.FederationService_VerifyLedger_FullMethodName:      NeedStatus,
	pb.FederationService_ListContracts_FullMethodName:     NeedStatus,
	pb.FederationService_ProposeContract_FullMethodName:   NeedAdmin,
	pb.FederationService_AnswerContract_FullMethodName:    NeedAdmin,
	pb.FederationService_TerminateContract_FullMethodName: NeedAdmin,
	pb.FederationService_PinKey_FullMethodName:            NeedAdmin,
	// The org's private signing key, only to another coordinator of the
	// org.
	pb.OrgKeyService_FetchOrgKey_FullMethodName: NeedCoordinator,
	// Federation pool and cross-org transport: on the org port, Deliver
	// comes only from a coordinator of the org forwarding a partner's
	// message to its leader (partners reach it on the cross-org port,
	// which admits only certificates of a pinned partner CA); anyone who
	// may see the org's status may list the federation's members.
	pb.FederationPeerService_Deliver_FullMethodName: NeedCoordinator,
	pb.FederationPeerService_Members_FullMethodName: NeedStatus,
	// The load manager's status (load, capacity, moved tasks): whoever
	// may see the org's status.
	pb.LoadService_LoadStatus_FullMethodName: NeedStatus,

	// Coordinators of one org ask each other before bootstrapping.
	pb.CoordinatorPeerService_RaftState_FullMethodName: NeedCoordinator,

	// Load balancers and orchestrators probe health without credentials.
	healthpb.Health_Check_FullMethodName: NeedNone,
	healthpb.Health_Watch_FullMethodName: NeedNone,
	healthpb.Health_List_FullMethodName:  NeedNone,
	// Server reflection lists and describes the services of a port: their
	// schema is public (this repository's proto), it reveals no data.
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      NeedNone,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: NeedNone,
}

// ErrMethodNotInTable is returned by MethodNeed for a method the table does
// not list; servers refuse such calls.
var ErrMethodNotInTable = errors.New("method is not in the role table (rpc/authz)")

// MethodNeed returns the need of a full method name.
func MethodNeed(fullMethod string) (Need, error) {
	n, ok := Methods[fullMethod]
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrMethodNotInTable, fullMethod)
	}
	return n, nil
}
