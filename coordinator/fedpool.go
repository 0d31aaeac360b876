package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/loadmgr"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// The federation pool (issue 11, items 1-3).
//
// Coordinators of every org gossip in a second serf pool, apart from their
// org's own pool (as Consul keeps its WAN pool apart from its LAN pools),
// encrypted with the federation's keyring, which is not the org's gossip
// key. The pool is discovery and failure detection only: it says which
// coordinators of which org exist, which one leads, and where their
// cross-org gRPC port is. Nothing is decided from it: who may talk to this
// org is what the org's Raft state pins (the partner's CA certificate),
// and every connection proves it with mutual TLS.

// FederationConfig places a coordinator in the federation pool. With
// SerfAddr empty the coordinator is in no federation.
type FederationConfig struct {
	// SerfAddr is the federation pool's gossip address (federation.bind).
	SerfAddr string
	// GRPCAddr is the cross-org gRPC port: partners' coordinators call it,
	// under mutual TLS against the CA this org pinned for them.
	GRPCAddr string
	// Join lists federation pool addresses of coordinators of any org.
	Join []string
	// DataAddr is the cross-org data port (federation.data-addr): partners'
	// coordinators relay data-plane streams through it. "" picks a free
	// port on GRPCAddr's host; the pool advertises it either way.
	DataAddr string
	// Keyring encrypts and authenticates the federation pool's gossip (16,
	// 24 or 32 bytes, distinct from the org's gossip key).
	Keyring []byte
	// Load tunes the org's load manager (federation.load: target
	// utilisation, cost function, load period, auto-accept policy).
	Load loadmgr.Config
}

// Enabled reports whether the coordinator joins a federation pool.
func (f FederationConfig) Enabled() bool { return f.SerfAddr != "" }

func (f FederationConfig) validate(c *Config) []error {
	if !f.Enabled() {
		if f.GRPCAddr != "" || len(f.Join) > 0 || len(f.Keyring) > 0 {
			return []error{errors.New("federation settings given without federation.bind (the federation pool's gossip address)")}
		}
		return nil
	}
	var errs []error
	if _, err := f.Load.Defaults(); err != nil {
		errs = append(errs, fmt.Errorf("federation.load: %w", err))
	}
	for name, addr := range map[string]string{"federation.bind": f.SerfAddr, "federation.grpc-addr": f.GRPCAddr} {
		if addr == "" {
			errs = append(errs, fmt.Errorf("%s is required in a federation", name))
		} else if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %v", name, addr, err))
		}
	}
	if c.TLS == nil {
		errs = append(errs, errors.New("a federation needs mutual TLS: cross-org connections are verified against the partners' pinned CAs"))
	}
	switch n := len(f.Keyring); {
	case n == 0:
		errs = append(errs, errors.New("federation.keyring-file is required: the federation pool's gossip is encrypted with its own key (fedstream keygen)"))
	case n != 16 && n != 24 && n != 32:
		errs = append(errs, fmt.Errorf("federation keyring is %d bytes: want 32 (16 or 24 also work)", n))
	case string(f.Keyring) == string(c.GossipKey):
		errs = append(errs, errors.New("the federation keyring must differ from the org's gossip key: with one key the federation could read and join the org's own pool"))
	}
	return errs
}

// Federation pool tags (beside tagOrg, tagRole, tagID and tagProto).
const (
	tagFedGRPC = "fedgrpc"
	tagLeader  = "leader"
	tagBuild   = "build"
)

// buildVersion names this build for the pool's tags.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// fedPool is this coordinator's part in the federation: its federation
// serf, the cross-org gRPC server and the connections to partners.
type fedPool struct {
	s        *Server
	serf     *serf.Serf
	server   *grpc.Server
	listener net.Listener
	// dataServer serves the cross-org data port (xorg_dataplane.go).
	dataServer   *grpc.Server
	dataListener net.Listener

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // org@addr
	// leaderTag is the leader tag last published.
	leaderTag bool
}

func (s *Server) setupFedPool() error {
	f := s.cfg.Federation
	p := s.pool
	if err := p.listen(f.GRPCAddr); err != nil {
		return err
	}
	if err := p.listenData(); err != nil {
		return err
	}
	host, portStr, err := net.SplitHostPort(f.SerfAddr)
	if err != nil {
		return fmt.Errorf("federation.bind %q: %w", f.SerfAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("federation.bind %q: bad port: %w", f.SerfAddr, err)
	}
	conf := serf.DefaultConfig()
	conf.Init()
	conf.NodeName = s.cfg.NodeID + "." + s.cfg.Org
	conf.Tags = p.tags(false)
	// Orgs are apart over a WAN; tests and dev shorten it like the org pool.
	ml := memberlist.DefaultWANConfig()
	if iv := s.cfg.Timings.GossipInterval; iv > 0 {
		ml = fastGossip(conf, iv)
		conf.LeavePropagateDelay = 4 * iv
	}
	ml.BindAddr, ml.BindPort = host, port
	ml.AdvertiseAddr, ml.AdvertisePort = host, port
	ml.Logger = logging.StdLogger(s.logger, "fed-memberlist")
	ml.SecretKey = f.Keyring
	ml.GossipVerifyIncoming, ml.GossipVerifyOutgoing = true, true
	conf.MemberlistConfig = ml
	conf.Logger = logging.StdLogger(s.logger, "fed-serf")
	conf.EnableNameConflictResolution = false
	if p.serf, err = serf.Create(conf); err != nil {
		return fmt.Errorf("start the federation pool on %s: %w", f.SerfAddr, err)
	}
	s.cfg.Federation.SerfAddr = net.JoinHostPort(host, strconv.Itoa(ml.BindPort))
	s.goRun(p.publishLeader)
	if len(f.Join) > 0 {
		s.goRun(p.retryJoin)
	}
	return nil
}

func (p *fedPool) tags(leader bool) map[string]string {
	s := p.s
	l := "0"
	if leader {
		l = "1"
	}
	return map[string]string{
		tagOrg: s.cfg.Org, tagRole: roleCoordinator, tagID: s.cfg.NodeID,
		tagFedGRPC: p.listener.Addr().String(), tagFedData: p.dataListener.Addr().String(), tagLeader: l,
		tagProto: strconv.Itoa(fsm.ProtocolVersion), tagBuild: buildVersion(),
		tagHostLevel: strconv.Itoa(hostLevel),
	}
}

// publishLeader keeps the leader tag in step with this node's Raft role,
// so partners call the leader first. A stale tag costs a forward, never
// correctness: a follower forwards what it receives to the leader.
func (p *fedPool) publishLeader(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lead := p.s.IsLeader()
		if lead == p.leaderTag {
			continue
		}
		if err := p.serf.SetTags(p.tags(lead)); err != nil {
			p.s.logger.Warn("publishing the leader tag in the federation pool", "err", err)
			continue
		}
		p.leaderTag = lead
	}
}

func (p *fedPool) retryJoin(ctx context.Context) {
	join := p.s.cfg.Federation.Join
	err := retry.Do(ctx, retry.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}, 0,
		func(_ int, err error, delay time.Duration) {
			p.s.logger.Warn("federation pool join failed; retrying", "addrs", join, "err", err, "retry_in", delay)
		},
		func(context.Context) error {
			n, err := p.serf.Join(join, true)
			if err == nil && n == 0 {
				err = errors.New("no address answered")
			}
			if err == nil {
				p.s.logger.Info("joined the federation pool", "contacted", n)
			}
			return err
		})
	if err != nil && ctx.Err() == nil {
		p.s.logger.Error("federation pool join gave up", "err", err)
	}
}

// listen starts the cross-org gRPC server. Its TLS handshake admits only
// a client certificate of a coordinator of another org whose CA this org
// pinned (in its Raft state), verified against that CA alone: an org
// without a pinned CA, a certificate another CA signed, or a coordinator
// of this org (which uses the org port) never reaches a handler.
func (p *fedPool) listen(addr string) error {
	s := p.s
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("federation.grpc-addr listen on %s: %w", addr, err)
	}
	p.listener = lis
	cfg := s.cfg.TLS.ServerConfig(tlsutil.Peer{}, false)
	// The org pool must not verify: the partner's CA replaces it below.
	cfg.ClientCAs = nil
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		_, err := s.verifyPartnerCert(cs.PeerCertificates, x509.ExtKeyUsageClientAuth, "")
		if err != nil {
			// The client only learns "bad certificate"; the reason is here.
			s.logger.Warn("refused a cross-org connection", "err", err)
		}
		return err
	}
	opts := append(rpc.ServerOptions(), grpc.Creds(credentials.NewTLS(cfg)))
	p.server = grpc.NewServer(opts...)
	pb.RegisterFederationPeerServiceServer(p.server, &fedPeerService{s: s, crossOrg: true})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := p.server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.logger.Error("cross-org grpc server stopped", "err", err)
		}
	}()
	return nil
}

// errCrossOrgRefused: a cross-org certificate is not admitted.
var errCrossOrgRefused = errors.New("cross-org certificate refused")

// verifyPartnerCert checks a partner's certificate chain against the CA
// this org pinned for the org the leaf names, and returns its identity.
// want, when set, is the only org accepted (a client dialling a partner).
func (s *Server) verifyPartnerCert(chain []*x509.Certificate, usage x509.ExtKeyUsage, want string) (rpc.Identity, error) {
	if len(chain) == 0 {
		return rpc.Identity{}, fmt.Errorf("%w: no certificate", errCrossOrgRefused)
	}
	leaf := chain[0]
	// Not verified yet: the claimed org only selects the CA to verify with.
	id, err := rpc.IdentityFromCert(leaf)
	if err != nil {
		return rpc.Identity{}, fmt.Errorf("%w: %v", errCrossOrgRefused, err)
	}
	switch {
	case id.Org == s.cfg.Org:
		return rpc.Identity{}, fmt.Errorf("%w: %s is of this org; the cross-org port serves other orgs only", errCrossOrgRefused, id)
	case want != "" && id.Org != want:
		return rpc.Identity{}, fmt.Errorf("%w: %s is not of org %s", errCrossOrgRefused, id, want)
	case id.Role != rpc.RoleCoordinator:
		return rpc.Identity{}, fmt.Errorf("%w: %s is not a coordinator", errCrossOrgRefused, id)
	}
	caPEM, ok, err := s.fed.PinnedCA(id.Org)
	if err != nil {
		return rpc.Identity{}, err
	}
	if !ok {
		return rpc.Identity{}, fmt.Errorf("%w: org %s has no pinned CA (no contract with it, and its CA was not pinned with fedstream contract pin)", errCrossOrgRefused, id.Org)
	}
	ca, err := federation.ParseOrgCA(id.Org, caPEM)
	if err != nil {
		return rpc.Identity{}, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return rpc.Identity{}, fmt.Errorf("%w: %s is not signed by the CA pinned for org %s: %v", errCrossOrgRefused, id, id.Org, err)
	}
	return id, nil
}

// crossOrgPeer is the identity of the caller on the cross-org port, whose
// certificate the handshake verified against its org's pinned CA.
func crossOrgPeer(ctx context.Context) (rpc.Identity, bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.AuthInfo == nil {
		return rpc.Identity{}, false
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return rpc.Identity{}, false
	}
	id, err := rpc.IdentityFromCert(info.State.PeerCertificates[0])
	return id, err == nil
}

// fedMember is a coordinator of some org as the federation pool sees it.
type fedMember struct {
	Org, Node, Addr, Status, Build, Proto string
	// HostLevel is the cross-org hosting level it advertises ("" for
	// none: an older build; see orgHostLevel).
	HostLevel string
	Leader    bool
}

// members lists the pool's coordinators, sorted by org and node.
func (p *fedPool) members() []fedMember {
	var out []fedMember
	for _, m := range p.serf.Members() {
		if m.Tags[tagRole] != roleCoordinator || m.Tags[tagOrg] == "" {
			continue
		}
		alive := m.Status == serf.StatusAlive
		out = append(out, fedMember{
			Org: m.Tags[tagOrg], Node: m.Tags[tagID], Addr: m.Tags[tagFedGRPC], Status: m.Status.String(),
			Build: m.Tags[tagBuild], Proto: m.Tags[tagProto], HostLevel: m.Tags[tagHostLevel],
			// A failed leader's tag is stale: it leads nothing now.
			Leader: alive && m.Tags[tagLeader] == "1",
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Org != out[j].Org {
			return out[i].Org < out[j].Org
		}
		return out[i].Node < out[j].Node
	})
	return out
}

// Known reports whether a coordinator of org is alive in the pool.
func (p *fedPool) Known(org string) bool {
	for _, m := range p.members() {
		if m.Org == org && m.Status == serf.StatusAlive.String() && m.Addr != "" {
			return true
		}
	}
	return false
}

// Call delivers m to org's leader: to the coordinator the pool tags as
// leader first, then to the others, which forward it. Each connection
// verifies the server against the CA pinned for org.
func (p *fedPool) Call(ctx context.Context, to string, m federation.Message) (federation.Message, error) {
	if _, ok, err := p.s.fed.PinnedCA(to); err != nil {
		return federation.Message{}, err
	} else if !ok {
		return federation.Message{}, fmt.Errorf("%w %q: pin it with fedstream contract pin %s KEY --ca CA.pem", federation.ErrNoPinnedCA, to, to)
	}
	var cands []fedMember
	for _, mm := range p.members() {
		if mm.Org == to && mm.Status == serf.StatusAlive.String() && mm.Addr != "" {
			cands = append(cands, mm)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].Leader && !cands[j].Leader })
	if len(cands) == 0 {
		return federation.Message{}, fmt.Errorf("%w %q: no coordinator of it is alive in the federation pool", federation.ErrUnknownOrg, to)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return federation.Message{}, err
	}
	var errs []error
	for _, c := range cands {
		conn, err := p.conn(to, c.Node, c.Addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := pb.NewFederationPeerServiceClient(conn).Deliver(ctx, &pb.FederationEnvelope{MessageJson: body})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s/%s at %s: %w", to, c.Node, c.Addr, err))
			if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
				continue
			}
			break
		}
		var ans federation.Message
		if err := json.Unmarshal(resp.MessageJson, &ans); err != nil {
			return federation.Message{}, fmt.Errorf("answer of %s: %w", to, err)
		}
		return ans, nil
	}
	return federation.Message{}, errors.Join(errs...)
}

// conn returns a connection to coordinator node of org at addr that
// accepts only a server certificate of that coordinator signed by the CA
// pinned for org, and presents this coordinator's own certificate.
func (p *fedPool) conn(org, node, addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := org + "/" + node + "@" + addr
	if c, ok := p.conns[key]; ok {
		if c.GetState() != connectivity.Shutdown {
			return c, nil
		}
		delete(p.conns, key)
	}
	s := p.s
	cfg := s.cfg.TLS.ClientConfig(tlsutil.Peer{})
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		id, err := s.verifyPartnerCert(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, org)
		if err != nil {
			return err
		}
		if id.Name != node {
			return fmt.Errorf("%w: %s is not coordinator %s", errCrossOrgRefused, id, node)
		}
		return nil
	}
	c, err := rpc.Dial(addr, "", grpc.WithTransportCredentials(credentials.NewTLS(cfg)), relayCallSize)
	if err != nil {
		return nil, err
	}
	p.conns[key] = c
	return c, nil
}

func (p *fedPool) close() error {
	var err error
	for _, srv := range []*grpc.Server{p.server, p.dataServer} {
		if srv == nil {
			continue
		}
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(2 * time.Second):
			srv.Stop()
		}
	}
	if p.serf != nil {
		if e := p.serf.Leave(); e != nil {
			p.s.logger.Warn("leaving the federation pool gracefully failed", "err", e)
		}
		err = errors.Join(err, p.serf.Shutdown())
	}
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[string]*grpc.ClientConn{}
	p.mu.Unlock()
	return err
}

const fedPeerMethod = "/fedstream.v1.FederationPeerService/"

// fedPeerService serves Deliver and Members, on the cross-org port
// (crossOrg) and on the org port.
type fedPeerService struct {
	pb.UnimplementedFederationPeerServiceServer
	s        *Server
	crossOrg bool
}

// Deliver hands a partner's message to this org's leader. The sender is
// the org of the verified certificate (cross-org port), or the org a
// coordinator of this org verified before forwarding (org port, where the
// role table admits only coordinators of the org); a message that claims
// another sender is refused.
func (ps *fedPeerService) Deliver(ctx context.Context, req *pb.FederationEnvelope) (*pb.FederationEnvelope, error) {
	s := ps.s
	var from string
	if ps.crossOrg {
		id, ok := crossOrgPeer(ctx)
		if !ok {
			return nil, status.Error(codes.Unauthenticated, "a coordinator certificate of a partner org is required")
		}
		from = id.Org
	} else {
		if !isForwarded(ctx) || req.FromOrg == "" {
			return nil, status.Error(codes.PermissionDenied, "partners deliver on the cross-org port; the org port takes only messages forwarded by a coordinator of the org")
		}
		from = req.FromOrg
	}
	var m federation.Message
	if err := json.Unmarshal(req.MessageJson, &m); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "federation message: %v", err)
	}
	if m.From != from {
		return nil, status.Errorf(codes.PermissionDenied, "the message says it is from org %q, the certificate is of org %q", m.From, from)
	}
	// Only a proposal may come from an org without a contract: its CA was
	// pinned by an operator in preparation for one. Everything else
	// refers to a contract, which Org.Receive checks.
	resp := &pb.FederationEnvelope{}
	fwd := &pb.FederationEnvelope{MessageJson: req.MessageJson, FromOrg: from}
	if handled, err := s.leaderOrForward(ctx, fedPeerMethod+"Deliver", fwd, resp); handled {
		return resp, err
	}
	var ans federation.Message
	var err error
	if federation.IsMigration(m.Kind) {
		ans, err = s.receiveMigration(ctx, m)
	} else {
		ans, err = s.fed.Receive(ctx, m)
	}
	if err != nil {
		return nil, fedStatus(err)
	}
	body, err := json.Marshal(ans)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &pb.FederationEnvelope{MessageJson: body}, nil
}

// Members lists every org's coordinators in the federation pool.
func (ps *fedPeerService) Members(ctx context.Context, _ *pb.FederationMembersRequest) (*pb.FederationMembersResponse, error) {
	if ps.crossOrg {
		return nil, status.Error(codes.PermissionDenied, "members are listed on the org port")
	}
	if ps.s.pool == nil {
		return nil, status.Error(codes.FailedPrecondition, "this coordinator is in no federation pool (federation.bind is not set)")
	}
	resp := &pb.FederationMembersResponse{}
	for _, m := range ps.s.pool.members() {
		resp.Members = append(resp.Members, &pb.FederationMember{Org: m.Org, Node: m.Node, Addr: m.Addr, Status: m.Status, Leader: m.Leader, Build: m.Build, Proto: m.Proto})
	}
	return resp, nil
}

// FederationSerfAddr is the federation pool's gossip address (port 0
// resolved), "" outside a federation.
func (s *Server) FederationSerfAddr() string {
	if s.pool == nil {
		return ""
	}
	return s.cfg.Federation.SerfAddr
}

// FederationGRPCAddr is the cross-org gRPC address, "" outside a
// federation.
func (s *Server) FederationGRPCAddr() string {
	if s.pool == nil || s.pool.listener == nil {
		return ""
	}
	return s.pool.listener.Addr().String()
}
