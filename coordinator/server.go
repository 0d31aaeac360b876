// Package coordinator is one node of an org's coordinator cluster: Raft
// wiring, serf discovery and bootstrap, the gRPC services for workers and
// clients, leader forwarding, worker liveness and task placement.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/loadmgr"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/opshttp"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// Server is one coordinator node.
type Server struct {
	cfg    Config
	logger *slog.Logger

	fsm  *fsm.FSM
	raft *raft.Raft
	// fed is the org's federation agent (signing identity, contracts,
	// ledger); set up in Start.
	fed *federation.Org
	// pool is this coordinator's part in the federation pool (nil outside
	// a federation); see fedpool.go.
	pool *fedPool
	// load is the org's load manager (nil outside a federation); it runs
	// while this coordinator leads.
	load *loadmgr.Manager
	// raftRef is raft for the transport's goroutines, which may dial
	// before NewRaft has returned.
	raftRef   atomic.Pointer[raft.Raft]
	transport *raft.NetworkTransport
	boltStore *raftboltdb.BoltStore
	leaderCh  chan bool

	serf       *serf.Serf
	serfEvents chan serf.Event
	// membersChanged wakes the leader's reapVoters when a member leaves or
	// fails (buffered 1: a pending wake-up covers later ones).
	membersChanged chan struct{}

	// Bootstrap (bootstrap.go). bootstrapped is true once this node has
	// Raft state or found a cluster that has; it is written by setupRaft,
	// then only by the bootstrap loop.
	bootstrapped bool
	// bootstrapKick wakes the bootstrap loop when serf membership changes
	// (buffered 1: a pending wake-up covers later ones).
	bootstrapKick chan struct{}
	// candidates is the sorted set of coordinator ids the bootstrap loop
	// would bootstrap with, as of its current attempt (RaftState reports it).
	candidates atomic.Pointer[[]string]
	// selfBootstrapped records that this process bootstrapped a cluster
	// (tests check that a node that should join did not).
	selfBootstrapped atomic.Bool

	grpcServer *grpc.Server
	listener   net.Listener
	// health is the gRPC health service: SERVING only while the node is
	// ready (see watchReadiness), NOT_SERVING before and after.
	health *health.Server
	// readyNow is the last readiness decision (watchReadiness).
	readyNow atomic.Pointer[readyState]

	// ops serves metrics, /healthz and /readyz over HTTP (and what others
	// mount with HandleHTTP); metrics are the node's own instruments and
	// liveStats the workers' latest per-task figures (leader only).
	ops       *opshttp.Server
	metrics   *coordMetrics
	liveStats *liveStats
	// xorg is the leader's volatile state of cross-org migration.
	xorg xorgMemory

	forwarder *forwarder
	auth      *authenticator
	liveness  *liveness
	// moveOrder: since when live moves inOrder held back have waited.
	moveOrder moveOrder
	plans     planCache
	// stateNews: when the leader learned each task's DCAA state
	// (replica_hints.go).
	stateNews *stateNews
	// rcWire encodes queries' reconfiguration states for the
	// assignment watch (reconfigWire).
	rcWire reconfigWire
	// leading is true while this node's leader duties run (set-up done).
	leading atomic.Bool
	// setUpTerm is the Raft term in which this node's leadership set-up
	// (its barrier) last completed, 0 before. A leader serves calls only
	// in that term: before its barrier, its state may lack entries the
	// previous leader committed, and a write built from it (a ledger
	// entry's sequence number, a retried request's first answer) would
	// be refused by the state machine or answered wrongly.
	setUpTerm atomic.Uint64
	// applier is the running plan applier while this node leads (see
	// startPlanApplier), nil otherwise.
	applier atomic.Pointer[planApplier]
	// scaleMu serialises rescales on this node: one at a time (rescale.go).
	scaleMu sync.Mutex

	// ctx is cancelled by Shutdown; every goroutine the server starts
	// watches it and is counted in wg.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	shutdownOnce sync.Once
	// acks notes when a plan's acknowledgements were all received
	// (reconfig_acks.go).
	acks acksReceived
}

// New validates cfg and builds (but does not start) a coordinator.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:    cfg,
		logger: cfg.Logger.With("org", cfg.Org, "node", cfg.NodeID),
		ctx:    ctx,
		cancel: cancel,
	}
	s.liveness = newLiveness()
	s.liveStats = newLiveStats()
	s.stateNews = newStateNews(time.Now())
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.metrics = newCoordMetrics()
	s.ops = opshttp.New(s.logger)
	s.metrics.register(s.ops.Registry(), s)
	s.ops.SetReady(s.readiness)
	// The web view and its JSON API take the root; /metrics, /healthz and
	// /readyz are more specific and keep their handlers.
	s.ops.Handle("/", s.WebHandler())
	s.membersChanged = make(chan struct{}, 1)
	s.bootstrapKick = make(chan struct{}, 1)
	return s, nil
}

// Start opens the data dir, starts Raft, serf and the gRPC server, and
// returns once all of them listen. Bootstrap happens in the background once
// enough coordinators are seen.
func (s *Server) Start() (err error) {
	defer func() {
		if err != nil {
			s.Shutdown()
		}
	}()
	if err := os.MkdirAll(s.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if s.fsm, err = fsm.New(s.logger.With("component", "fsm")); err != nil {
		return err
	}
	if err := s.setupFederation(); err != nil {
		return err
	}
	if err := s.setupLoadManager(); err != nil {
		return err
	}
	if err := s.setupRaft(); err != nil {
		return err
	}
	if err := s.setupGRPC(); err != nil {
		return err
	}
	if err := s.setupSerf(); err != nil {
		return err
	}
	if s.pool != nil {
		if err := s.setupFedPool(); err != nil {
			return err
		}
	}
	s.forwarder = newForwarder(s)
	if s.cfg.HTTPAddr != "" {
		if err := s.ops.Start(s.cfg.HTTPAddr); err != nil {
			return err
		}
	}
	s.goRun(s.watchReadiness)
	s.goRun(s.watchHalt)
	s.goRun(s.monitorLeadership)
	s.goRun(s.handleSerfEvents)
	s.goRun(s.syncOrgKey)
	s.goRun(s.runBootstrap)
	if len(s.cfg.Join) > 0 {
		s.goRun(s.retryJoin)
	}
	if s.cfg.InsecurePlaintext {
		s.logger.Warn("INSECURE: coordinator running with --insecure-plaintext: gRPC and Raft traffic is unencrypted and unauthenticated; anyone who can reach these ports can join, vote and read")
	}
	mode := "authenticated"
	if s.DevMode() {
		mode = "dev (no tokens configured: every caller is accepted)"
		s.logger.Warn("coordinator running in dev mode: no join or admin token configured, every caller is accepted")
	}
	s.logger.Info("coordinator started", "grpc", s.GRPCAddr(), "raft", s.cfg.RaftAddr, "serf", s.cfg.SerfAddr, "http", s.HTTPAddr(),
		"bootstrap_expect", s.cfg.BootstrapExpect, "auth", mode, "mtls", s.cfg.TLS != nil)
	return nil
}

// watchHalt shuts the node down when its FSM halts on a committed entry it
// cannot apply (see fsm.FSM.Halted): serving reads from, or leading with, a
// state that lacks a committed entry would diverge from the other nodes.
func (s *Server) watchHalt(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.fsm.Halted():
		s.logger.Error("STOPPING COORDINATOR: the replicated log holds an entry this build cannot apply; upgrade this node to the build the other coordinators run",
			"err", s.fsm.HaltErr())
		// Shutdown waits for this goroutine (s.wg): run it outside.
		go func() {
			if err := s.Shutdown(); err != nil {
				s.logger.Error("shutdown after halt", "err", err)
			}
		}()
	}
}

// Stopped is closed once Shutdown began, whether the caller asked for it
// or the node stopped itself (Err says why).
func (s *Server) Stopped() <-chan struct{} { return s.ctx.Done() }

// Err is why the node stopped itself: non-nil (wrapping fsm.ErrHalted)
// after its FSM met a committed entry it cannot apply.
func (s *Server) Err() error {
	if s.fsm == nil {
		return nil
	}
	return s.fsm.HaltErr()
}

func (s *Server) goRun(f func(ctx context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f(s.ctx)
	}()
}

// DevMode reports whether the coordinator accepts callers without tokens.
func (s *Server) DevMode() bool { return s.cfg.JoinToken == "" && s.cfg.AdminToken == "" }

// GRPCAddr is the address the gRPC server actually listens on.
func (s *Server) GRPCAddr() string {
	if s.listener != nil {
		return s.listener.Addr().String()
	}
	return s.cfg.GRPCAddr
}

// RaftAddr is the address of the Raft transport (port 0 resolved once started).
func (s *Server) RaftAddr() string { return s.cfg.RaftAddr }

// SerfAddr is the serf gossip address (port 0 resolved once started).
func (s *Server) SerfAddr() string { return s.cfg.SerfAddr }

// NodeID returns the node's id.
func (s *Server) NodeID() string { return s.cfg.NodeID }

// IsLeader reports whether this node is the Raft leader.
func (s *Server) IsLeader() bool { return s.raft != nil && s.raft.State() == raft.Leader }

// State exposes the node's replicated state store (read-only use).
func (s *Server) State() *fsm.StateStore { return s.fsm.State() }

// Raft exposes the raft node to tests.
func (s *Server) Raft() *raft.Raft { return s.raft }

func (s *Server) setupRaft() error {
	t := s.cfg.Timings
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.cfg.NodeID)
	rc.Logger = logging.HCLog(s.logger, "raft")
	rc.HeartbeatTimeout = t.RaftHeartbeat
	rc.ElectionTimeout = t.RaftElection
	rc.LeaderLeaseTimeout = t.RaftLeaderLease
	rc.CommitTimeout = 5 * time.Millisecond
	rc.SnapshotThreshold = 8192
	rc.SnapshotInterval = 2 * time.Minute
	// A buffered notify channel: raft blocks on it, so it is always drained
	// by monitorLeadership.
	s.leaderCh = make(chan bool, 8)
	rc.NotifyCh = s.leaderCh

	advertise, err := net.ResolveTCPAddr("tcp", s.cfg.RaftAddr)
	if err != nil {
		return fmt.Errorf("raft-addr %q: %w", s.cfg.RaftAddr, err)
	}
	var adv net.Addr = advertise
	if advertise.Port == 0 {
		adv = nil // port 0: advertise the port the OS picks
	}
	// MaxRPCsInFlight 1 turns off hashicorp/raft's pipelined replication
	// (raft then replicates with one AppendEntries at a time per follower,
	// batching entries, ample for a coordinator's write rate). The
	// pipeline can wedge (hashicorp/raft issue 612): its sender, decoder
	// and raft's pipelineDecode hand requests over unbuffered channels;
	// when pipelineDecode stops (a newer term, a refused append) with a
	// response in flight, the decoder and the next send block on each
	// other for ever, no socket deadline frees them, and that follower is
	// never replicated to again while raft.Shutdown waits on the goroutine
	// for ever (seen as a hung TestBarrierFailureTransfersLeadership).
	netCfg := func(stream raft.StreamLayer) *raft.NetworkTransportConfig {
		return &raft.NetworkTransportConfig{
			Stream: stream, MaxPool: 3, Timeout: 10 * time.Second, MaxRPCsInFlight: 1,
			Logger: logging.HCLog(s.logger, "raft-net"),
		}
	}
	if s.cfg.TLS == nil {
		s.transport, err = raft.NewTCPTransportWithConfig(s.cfg.RaftAddr, adv, netCfg(nil))
	} else {
		var layer *tlsStreamLayer
		if layer, err = newTLSStreamLayer(s.cfg.RaftAddr, s.cfg.TLS, s.raftIDOf); err == nil {
			if adv != nil {
				layer.advertise = adv
			}
			var stream raft.StreamLayer = layer
			if h := s.cfg.hooks.raftStream; h != nil {
				stream = h(layer)
			}
			s.transport = raft.NewNetworkTransportWithConfig(netCfg(stream))
		}
	}
	if err != nil {
		return fmt.Errorf("raft transport on %s: %w", s.cfg.RaftAddr, err)
	}
	// From here on the configured address is the real one (port 0 resolved).
	s.cfg.RaftAddr = string(s.transport.LocalAddr())
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(s.cfg.DataDir, "snapshots"), 2, logging.HCLog(s.logger, "snapshots"))
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	s.boltStore, err = raftboltdb.NewBoltStore(filepath.Join(s.cfg.DataDir, "raft.db"))
	if err != nil {
		return fmt.Errorf("raft store %s: %w", filepath.Join(s.cfg.DataDir, "raft.db"), err)
	}
	logs, err := raft.NewLogCache(512, s.boltStore)
	if err != nil {
		return err
	}
	existing, err := raft.HasExistingState(logs, s.boltStore, snaps)
	if err != nil {
		return fmt.Errorf("inspect raft state: %w", err)
	}
	s.bootstrapped = existing
	var stable raft.StableStore = s.boltStore
	if h := s.cfg.hooks.stableStore; h != nil {
		stable = h(stable)
	}
	s.raft, err = raft.NewRaft(rc, timedFSM{s.fsm, s.metrics.fsmApply, &s.acks}, logs, stable, snaps, s.transport)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	s.raftRef.Store(s.raft)
	if existing {
		s.logger.Info("rejoining from existing raft state; not bootstrapping", "data_dir", s.cfg.DataDir)
	}
	return nil
}

func (s *Server) setupGRPC() error {
	lis, err := net.Listen("tcp", s.cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("grpc listen on %s: %w", s.cfg.GRPCAddr, err)
	}
	s.listener = lis
	s.auth = newAuthenticator(s.cfg.Org, s.cfg.JoinToken, s.cfg.AdminToken, s.State)
	s.auth.plaintext = s.cfg.TLS == nil
	opts := rpc.ServerOptions()
	if s.cfg.TLS != nil {
		// Certificates are optional at the handshake only so that a new
		// worker can register; certGate refuses every other call without one.
		gate := certGate{org: s.cfg.Org}
		opts = append(opts, s.cfg.TLS.ServerOption(tlsutil.Peer{}, true),
			grpc.ChainUnaryInterceptor(gate.unary, s.auth.unary),
			grpc.ChainStreamInterceptor(gate.stream, s.auth.stream))
	} else {
		opts = append(opts, grpc.ChainUnaryInterceptor(s.auth.unary), grpc.ChainStreamInterceptor(s.auth.stream))
	}
	s.grpcServer = grpc.NewServer(opts...)
	pb.RegisterWorkerServiceServer(s.grpcServer, &workerService{s: s})
	pb.RegisterAdminServiceServer(s.grpcServer, &adminService{s: s})
	pb.RegisterReconfigServiceServer(s.grpcServer, &reconfigService{s: s})
	pb.RegisterHealthServiceServer(s.grpcServer, &healthService{s: s})
	pb.RegisterTokenServiceServer(s.grpcServer, &tokenService{s: s})
	pb.RegisterCoordinatorPeerServiceServer(s.grpcServer, &peerService{s: s})
	pb.RegisterFederationServiceServer(s.grpcServer, &federationService{s: s})
	pb.RegisterOrgKeyServiceServer(s.grpcServer, &orgKeyService{s: s})
	pb.RegisterLoadServiceServer(s.grpcServer, &loadService{s: s})
	pb.RegisterFederationPeerServiceServer(s.grpcServer, &fedPeerService{s: s})
	if s.pool != nil {
		// The org's workers read partners' streams through it.
		pb.RegisterDataPlaneServer(s.grpcServer, &xorgData{s: s})
	}
	healthpb.RegisterHealthServer(s.grpcServer, s.health)
	reflection.Register(s.grpcServer)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpcServer.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.logger.Error("grpc server stopped", "err", err)
		}
	}()
	return nil
}

// Shutdown stops every component; it is safe to call more than once and on a
// partially started server.
func (s *Server) Shutdown() error {
	var err error
	s.shutdownOnce.Do(func() {
		s.health.Shutdown() // NOT_SERVING from here on
		s.cancel()
		closeCtx, cancelClose := context.WithTimeout(context.Background(), 2*time.Second)
		if e := s.ops.Close(closeCtx); e != nil {
			s.logger.Debug("closing the HTTP server", "err", e)
		}
		cancelClose()
		if s.grpcServer != nil {
			stopped := make(chan struct{})
			go func() { s.grpcServer.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(2 * time.Second):
				s.grpcServer.Stop()
			}
		}
		if s.pool != nil {
			err = errors.Join(err, s.pool.close())
		}
		if s.serf != nil {
			if e := s.serf.Leave(); e != nil {
				// Not fatal: the others detect the failure instead.
				s.logger.Warn("leaving serf gracefully failed", "err", e)
			}
			if e := s.serf.Shutdown(); e != nil {
				err = errors.Join(err, e)
			}
		}
		raftStopped := true
		if s.raft != nil {
			var e error
			raftStopped, e = s.shutdownRaft()
			err = errors.Join(err, e)
		}
		if s.transport != nil {
			if e := s.transport.Close(); e != nil {
				err = errors.Join(err, fmt.Errorf("close raft transport: %w", e))
			}
			// Close leaves pooled outgoing connections, and the handlers
			// of incoming ones, open.
			s.transport.CloseStreams()
		}
		s.wg.Wait()
		if s.forwarder != nil {
			s.forwarder.close()
		}
		// When raft did not stop, its goroutines may still touch the log
		// store: it is left open rather than pulled from under them.
		if s.boltStore != nil && raftStopped {
			if e := s.boltStore.Close(); e != nil {
				err = errors.Join(err, e)
			}
		}
	})
	return err
}

// Bounds on stopping Raft: raftShutdownGrace is how long raft.Shutdown
// may take by itself; then the transport is closed (its listener, the
// handlers of incoming connections and the pooled outgoing ones), which
// fails RPCs waiting on them, and raft gets raftShutdownLimit more (RPCs
// on connections in use end by their 10s deadline) before Shutdown gives
// up on it rather than hang the process.
const (
	raftShutdownGrace = 3 * time.Second
	raftShutdownLimit = 30 * time.Second
)

// ErrRaftShutdownStuck means Raft's goroutines did not stop within
// raftShutdownGrace+raftShutdownLimit even after its transport was closed;
// the server is shut down otherwise, with its log store left open.
var ErrRaftShutdownStuck = errors.New("raft did not stop after its transport was closed")

// shutdownRaft stops Raft and waits for its goroutines, closing the
// transport if they are not done within raftShutdownGrace. stopped is
// false when they are still running after raftShutdownLimit more.
func (s *Server) shutdownRaft() (stopped bool, err error) {
	f := s.raft.Shutdown()
	done := make(chan error, 1)
	go func() { done <- f.Error() }() // returns once raft's goroutines end
	wait := func(d time.Duration) (bool, error) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case e := <-done:
			return true, e
		case <-t.C:
			return false, nil
		}
	}
	if ok, e := wait(raftShutdownGrace); ok {
		return true, e
	}
	s.logger.Warn("raft is slow to stop; closing its transport to free blocked replication", "waited", raftShutdownGrace)
	if s.transport != nil {
		_ = s.transport.Close()
		s.transport.CloseStreams()
	}
	if ok, e := wait(raftShutdownLimit); ok {
		return true, e
	}
	return false, ErrRaftShutdownStuck
}
