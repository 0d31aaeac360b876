package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// The cross-org data plane (issue 11 item 6).
//
// Streams cross between orgs only through the orgs' coordinators, as
// traffic between Consul datacenters crosses through mesh gateways: a
// worker never talks to another org's worker, and nothing of an org but
// its coordinators' cross-org ports is exposed to a partner.
//
//	worker of A --org mTLS--> coordinator of A (org port, DataPlane relay)
//	            --cross-org mTLS, pinned CA--> coordinator of B (data port)
//	            --org mTLS--> worker of B
//
// The data port (tag feddp) admits, during the TLS handshake, only a
// coordinator certificate of another org that verifies against the CA
// this org pinned for that org *and* with which this org holds an active
// contract in force (or, once it ended, still a task in either
// direction, to bring home): an org without a contract (even a pinned one), a
// certificate another CA signed, and this org's own certificates never
// reach a handler. Behind the handshake each call is checked against the
// hosted-task records in this org's Raft state: a partner reads only the
// tasks it hosts for this org and the streams of queries that have a
// task hosted at it, and this org's copies of the tasks it hosts for the
// partner. Inside the org the coordinator calls its workers with its own
// certificate (a worker takes a coordinator of its org as a data-plane
// peer).
//
// Partners never reach each other: the owner relays partner to partner.
// A stream the owner's consumers read from a copy at partner Q is served
// to partner P (a consumer hosted there) by the owner calling Q's data
// port as the task's owner, so any placement of a query's tasks over its
// owner and its partners can run, and each partner talks only to the
// owner it holds a contract with (P and Q need none with each other, and
// neither learns the other's addresses).

// tagFedData is the federation pool tag naming the cross-org data port.
const tagFedData = "feddp"

// errNoRoute: a data-plane call names a stream this coordinator cannot
// route (no such task here, or not one the caller may read).
var errNoRoute = errors.New("no cross-org route for this stream")

// listenData starts the cross-org data port on the host of the cross-org
// gRPC port, at a port the pool advertises.
func (p *fedPool) listenData() error {
	s := p.s
	host, _, err := net.SplitHostPort(s.cfg.Federation.GRPCAddr)
	if err != nil {
		return fmt.Errorf("federation.grpc-addr %q: %w", s.cfg.Federation.GRPCAddr, err)
	}
	addr := s.cfg.Federation.DataAddr
	if addr == "" {
		addr = net.JoinHostPort(host, "0")
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cross-org data port: listen on %s: %w", addr, err)
	}
	p.dataListener = lis
	cfg := s.cfg.TLS.ServerConfig(tlsutil.Peer{}, false)
	cfg.ClientCAs = nil
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		_, err := s.verifyDataPartner(cs.PeerCertificates, x509.ExtKeyUsageClientAuth, "")
		if err != nil {
			s.logger.Warn("refused a cross-org data-plane connection", "err", err)
		}
		return err
	}
	opts := append(rpc.ServerOptions(), grpc.Creds(credentials.NewTLS(cfg)))
	p.dataServer = grpc.NewServer(opts...)
	pb.RegisterDataPlaneServer(p.dataServer, &xorgData{s: s, crossOrg: true})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := p.dataServer.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.logger.Error("cross-org data port stopped", "err", err)
		}
	}()
	return nil
}

// FederationDataAddr is the cross-org data port's address, "" outside a
// federation.
func (s *Server) FederationDataAddr() string {
	if s.pool == nil || s.pool.dataListener == nil {
		return ""
	}
	return s.pool.dataListener.Addr().String()
}

// verifyDataPartner admits a partner's coordinator to the data plane: its
// certificate verifies against the CA pinned for its org (as on the
// control port) and this org holds an active contract in force with that
// org.
func (s *Server) verifyDataPartner(chain []*x509.Certificate, usage x509.ExtKeyUsage, want string) (rpc.Identity, error) {
	id, err := s.verifyPartnerCert(chain, usage, want)
	if err != nil {
		return rpc.Identity{}, err
	}
	if _, err := s.activeContractWith(id.Org, time.Now()); err != nil && !s.hostsWith(id.Org) {
		return rpc.Identity{}, fmt.Errorf("%w: %v", errCrossOrgRefused, err)
	}
	return id, nil
}

// hostsWith reports whether a task of this org runs at org or one of
// org's runs here: after its contract ended, a task still has to come
// home from its last state, through the data port.
func (s *Server) hostsWith(org string) bool {
	hs, err := s.State().HostedTasks(nil)
	if err != nil {
		return false
	}
	for _, h := range hs {
		if (h.Owner == org && h.Host == s.cfg.Org) || (h.Owner == s.cfg.Org && h.Host == org) {
			return true
		}
	}
	return false
}

// activeContractWith returns an active contract with org that is in
// force at now.
func (s *Server) activeContractWith(org string, now time.Time) (federation.ContractDoc, error) {
	cs, err := s.fed.Contracts()
	if err != nil {
		return federation.ContractDoc{}, err
	}
	for _, c := range cs {
		partner := c.Terms.Partner
		if partner == s.cfg.Org {
			partner = c.Terms.Proposer
		}
		if partner == org && c.Status == federation.StatusActive && c.Terms.MPA().InForce(now) {
			return c, nil
		}
	}
	return federation.ContractDoc{}, fmt.Errorf("org %s holds no active contract in force with %s", org, s.cfg.Org)
}

// xorgData relays DataPlane Subscribe and FetchSnapshot: on the org port
// (crossOrg false) from this org's workers to a partner, on the data port
// (crossOrg true) from a partner to this org's workers.
type xorgData struct {
	pb.UnimplementedDataPlaneServer
	s        *Server
	crossOrg bool
}

// route says where a call for (query, task, generation) goes: to a
// worker of this org (workerAddr) or to a partner org (partner). caller
// is the calling org on the data port, "" on the org port.
//
// toGen is the generation to ask the worker for: the one asked, except
// for a partner reading an upstream of a task it hosts, which does not
// know the owner's generations (it asks for whichever copy the owner's
// consumers read).
//
// A subscription of a partner that names a copy gone since reads the
// consumers' copy instead; routeExact is route for calls meant for that
// generation's copy only (a snapshot a new copy starts from).
func (s *Server) route(caller, query, taskID string, gen int) (workerAddr, partner string, toGen int, err error) {
	return s.routeCall(caller, query, taskID, gen, false)
}

// routeExact is route, refusing (NotFound) a partner's call for a
// generation of a task it hosts that no copy has any more.
func (s *Server) routeExact(caller, query, taskID string, gen int) (workerAddr, partner string, toGen int, err error) {
	return s.routeCall(caller, query, taskID, gen, true)
}

func (s *Server) routeCall(caller, query, taskID string, gen int, exact bool) (workerAddr, partner string, toGen int, err error) {
	st := s.State()
	hosted, err := st.HostedTasks(nil)
	if err != nil {
		return "", "", 0, status.Error(codes.Internal, err.Error())
	}
	workerAddrOf := func(id string) (string, error) {
		w, err := st.Worker(nil, id)
		if err != nil {
			return "", status.Error(codes.Internal, err.Error())
		}
		if w == nil || w.Addr == "" || w.Org != s.cfg.Org || isPartnerWorker(w) {
			return "", status.Errorf(codes.Unavailable, "%v: task %s is on no worker of org %s", errNoRoute, taskID, s.cfg.Org)
		}
		return w.Addr, nil
	}
	// A partner's task this org hosts: only its owner reads it from
	// outside.
	for _, h := range hosted {
		if h.Host == s.cfg.Org && h.TaskID == taskID && h.Query == query && (caller == "" || caller == h.Owner) {
			if caller == "" {
				break // this org's own workers never read a hosted copy through the relay
			}
			if h.WorkerID == "" {
				return "", "", 0, status.Errorf(codes.Unavailable, "hosted task %s is not placed yet", taskID)
			}
			addr, err := workerAddrOf(h.WorkerID)
			return addr, "", gen, err
		}
	}
	t, err := st.Task(nil, taskID)
	if err != nil {
		return "", "", 0, status.Error(codes.Internal, err.Error())
	}
	if t != nil && t.Query == query {
		if caller == "" {
			// This org's worker reads its own task: only a copy at a
			// partner goes through the relay.
			for _, h := range hosted {
				if h.Owner == s.cfg.Org && h.TaskID == taskID && (gen == 0 || gen == h.Generation) {
					return "", h.Host, gen, nil
				}
			}
			return "", "", 0, status.Errorf(codes.NotFound, "%v: task %s generation %d does not run at a partner", errNoRoute, taskID, gen)
		}
		entitled := false
		for _, h := range hosted {
			if h.Owner == s.cfg.Org && h.Host == caller && h.Query == query {
				entitled = true
			}
		}
		if !entitled {
			return "", "", 0, status.Errorf(codes.PermissionDenied, "%v: org %s hosts no task of query %s", errNoRoute, caller, query)
		}
		at, atGen := consumerPlacement(t)
		hostedThere := false
		for _, h := range hosted {
			hostedThere = hostedThere || (h.Owner == s.cfg.Org && h.Host == caller && h.TaskID == taskID)
		}
		toGen := gen
		switch {
		case gen == 0 || gen == atGen || !hostedThere:
			// The copy this org's consumers read: a partner's placements
			// of the upstreams of a task it hosts carry no generation
			// (it does not know this org's), and only the copies of a
			// task it hosts may be asked for by generation.
			toGen = atGen
		case gen == t.Gen():
			at = t.WorkerID
		case t.MovingFrom != "" && gen == t.MovingFromGeneration:
			at = t.MovingFrom
		case !exact:
			// A consumer hosted at the caller names the generation its
			// placement had (none: its worker asks for 1), a copy gone
			// since when the upstream moved to the caller too.
			toGen = atGen
		default:
			return "", "", 0, status.Errorf(codes.NotFound, "task %s has no copy of generation %d", taskID, gen)
		}
		if org := s.partnerOf(st, at); org != "" {
			// The copy runs at a partner (the caller itself, or another
			// one): relayed from that partner's data port, this org
			// calling as the task's owner. Partners never call each
			// other: a stream of this org's query crosses only between
			// this org and one partner at a time, so a consumer placed
			// at one partner reads a producer placed at another (or at
			// the same) through this org, whatever the placement.
			for _, h := range hosted {
				if h.Owner == s.cfg.Org && h.Host == org && h.TaskID == taskID {
					return "", org, toGen, nil
				}
			}
			return "", "", 0, status.Errorf(codes.Unavailable, "%v: task %s is placed at org %s, which this org has no record of hosting it", errNoRoute, taskID, org)
		}
		addr, err := workerAddrOf(at)
		return addr, "", toGen, err
	}
	if caller == "" {
		// An upstream of a task this org hosts: it runs at the owner.
		for _, h := range hosted {
			if h.Host == s.cfg.Org && h.Query == query {
				return "", h.Owner, gen, nil
			}
		}
	}
	return "", "", 0, status.Errorf(codes.NotFound, "%v: no task %s of query %s", errNoRoute, taskID, query)
}

// partnerOf is the partner org whose worker record is workerID, "" for
// any other (a worker of this org, none, or unknown).
func (s *Server) partnerOf(st *fsm.StateStore, workerID string) string {
	if workerID == "" {
		return ""
	}
	w, err := st.Worker(nil, workerID)
	if err != nil || w == nil || !isPartnerWorker(w) {
		return ""
	}
	return w.Labels[partnerLabel]
}

// callerOrg is the org of the call's caller on the data port ("" on the
// org port, where only this org's workers are admitted).
func (x *xorgData) callerOrg(ctx context.Context) (string, error) {
	if !x.crossOrg {
		return "", nil
	}
	id, ok := crossOrgPeer(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "a coordinator certificate of a partner org is required")
	}
	return id.Org, nil
}

// target dials where a call goes, and says which generation to ask for.
func (x *xorgData) target(ctx context.Context, query, taskID string, gen int, exact bool) (*grpc.ClientConn, int, error) {
	caller, err := x.callerOrg(ctx)
	if err != nil {
		return nil, 0, err
	}
	route := x.s.route
	if exact {
		route = x.s.routeExact
	}
	addr, partner, toGen, err := route(caller, query, taskID, gen)
	if err != nil {
		return nil, 0, err
	}
	if partner != "" {
		c, err := x.s.pool.dataConn(ctx, partner)
		return c, toGen, err
	}
	c, err := x.s.pool.workerConn(addr)
	return c, toGen, err
}

func (x *xorgData) Subscribe(in pb.DataPlane_SubscribeServer) error {
	ctx := in.Context()
	first, err := in.Recv()
	if err != nil {
		return err
	}
	if first.Stream == nil {
		return status.Error(codes.InvalidArgument, "subscribe: the first request names the stream")
	}
	if !x.crossOrg && !first.NoAck {
		// As on a worker: an acknowledgement releases tuples for every
		// consumer, so only a task (a worker of the org) may send one;
		// the role table admits readers to Subscribe for no_ack tails.
		if id, ok := rpc.PeerIdentity(ctx); !ok || id.Org != x.s.cfg.Org || id.Role != rpc.RoleWorker {
			return status.Error(codes.PermissionDenied, "subscribe: an acknowledging subscription is for the org's workers only; clients subscribe with no_ack")
		}
	}
	conn, gen, err := x.target(ctx, first.Stream.Query, first.Stream.TaskId, int(first.Stream.Generation), false)
	if err != nil {
		return err
	}
	first.Stream.Generation = int32(gen)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out, err := pb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	if err := out.Send(first); err != nil {
		return relayErr(out.RecvMsg(new(pb.Batch)))
	}
	// Requests (acknowledgements) one way, batches the other. The
	// request pump ends when the caller's stream ends or ctx (this
	// handler) does.
	go func() {
		for {
			m, err := in.Recv()
			if err != nil {
				_ = out.CloseSend()
				return
			}
			if out.Send(m) != nil {
				return
			}
		}
	}()
	header := true
	for {
		b, err := out.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return relayErr(err)
		}
		if header {
			// Pass on the serving worker's data-plane level (it came
			// with its first message), so the subscriber sees the
			// producer's, not the relay's.
			header = false
			if md, err := out.Header(); err == nil {
				for _, h := range []string{rpc.DataPlaneLevelHeader, rpc.StreamRestartedHeader} {
					if v := md.Get(h); len(v) > 0 {
						_ = in.SetHeader(metadata.Pairs(h, v[0]))
					}
				}
			}
		}
		if err := in.Send(b); err != nil {
			return err
		}
	}
}

func (x *xorgData) FetchSnapshot(req *pb.FetchSnapshotRequest, in pb.DataPlane_FetchSnapshotServer) error {
	ctx := in.Context()
	conn, gen, err := x.target(ctx, req.Query, req.TaskId, int(req.Generation), true)
	if err != nil {
		return err
	}
	req.Generation = int32(gen)
	// The bytes come over this relayed stream, never over a connection of
	// their own (fast snapshot transfer): the serving worker's bulk
	// listener is for this org's workers, the fetching worker would dial
	// its port on the host of the relay it called, and its certificate is
	// not of the fetching worker's org. Offered one, the fetching worker
	// failed its dial (or waited out the dial timeout where a firewall
	// drops it) before asking again over the stream.
	req.Bulk, req.BulkSizeInline = false, false
	// The caller's assignment index is of its own org's log: here it
	// would be taken for one of this org's (worker/runtime superseded.go)
	// and could hide a move rolled back. Not known, the serving copy
	// names an input gap as it always did.
	req.PlacedIndex = 0
	out, err := pb.NewDataPlaneClient(conn).FetchSnapshot(ctx, req)
	if err != nil {
		return relayErr(err)
	}
	for {
		c, err := out.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return relayErr(err)
		}
		if err := in.Send(c); err != nil {
			return err
		}
	}
}

// relayErr passes a status on unchanged (the caller acts on its code).
func relayErr(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// workerConn is a connection to a worker of this org, made with this
// coordinator's certificate and accepting only a worker certificate of
// the org.
func (p *fedPool) workerConn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := "worker@" + addr
	if c, ok := p.conns[key]; ok && c.GetState() != connectivity.Shutdown {
		return c, nil
	}
	c, err := rpc.Dial(addr, "", p.s.cfg.TLS.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker}}), relayCallSize)
	if err != nil {
		return nil, err
	}
	p.conns[key] = c
	return c, nil
}

// dataConn is a connection to the data port of an alive coordinator of
// org (the one the pool tags leader first), verified against the CA
// pinned for org.
func (p *fedPool) dataConn(ctx context.Context, org string) (*grpc.ClientConn, error) {
	type cand struct {
		node, addr string
		leader     bool
	}
	var cands []cand
	for _, m := range p.serf.Members() {
		if m.Tags[tagOrg] != org || m.Tags[tagRole] != roleCoordinator || m.Status != serf.StatusAlive || m.Tags[tagFedData] == "" {
			continue
		}
		cands = append(cands, cand{m.Tags[tagID], m.Tags[tagFedData], m.Tags[tagLeader] == "1"})
	}
	if len(cands) == 0 {
		return nil, status.Errorf(codes.Unavailable, "%v %q: no coordinator of it with a data port is alive in the federation pool", federation.ErrUnknownOrg, org)
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].leader && !cands[j].leader })
	var errs []error
	for _, c := range cands {
		conn, err := p.conn(org, c.node, c.addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return conn, nil
	}
	return nil, status.Error(codes.Unavailable, errors.Join(errs...).Error())
}

// relayCallSize lets relayed calls receive the data plane's largest
// messages (a batch or a snapshot piece: 16 MiB, worker/dataplane).
var relayCallSize = grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(32<<20), grpc.MaxCallSendMsgSize(32<<20))

// isPartnerWorker reports whether w stands for a partner org in this
// org's placements (a task at a partner is placed on it).
func isPartnerWorker(w *fsm.Worker) bool { return w.Labels[partnerLabel] != "" }

// partnerLabel marks the worker record standing for a partner org; its
// value is the org.
const partnerLabel = "fedstream.partner-org"
