// Package worker is the stateless worker process: it registers with its
// org's coordinators, heartbeats, long-polls its assignments and runs the
// assigned tasks (worker/runtime), serving its data plane over gRPC.
package worker

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/opshttp"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/dataplane"
	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// Config is what a worker needs to join its org.
type Config struct {
	Org          string
	Name         string
	Coordinators []string
	// GRPCAddr is where the data plane listens (host:port; port 0 picks one).
	GRPCAddr  string
	Cores     int
	Labels    map[string]string
	JoinToken string
	Logger    *slog.Logger
	// BoundaryInterval is how often sources emit BOUNDARY tuples (stream time).
	BoundaryInterval time.Duration
	// WatchWait bounds each assignment long poll.
	WatchWait time.Duration
	// StallAfter, SubscriberLease and OverrunGrace tune the task runtime
	// (zero: its defaults; see runtime.Options and dataplane.BufferOptions).
	StallAfter, SubscriberLease, OverrunGrace time.Duration
	// DCAAKeepTuples and InputPendingTuples bound what a task holds (zero:
	// the runtime's defaults; see runtime.Options).
	DCAAKeepTuples, InputPendingTuples int
	// MaxFuture bounds how far ahead of an ingest source's time a record
	// may be dated (0: runtime.DefaultMaxFuture).
	MaxFuture time.Duration
	// TLS holds the org's CA, to verify the coordinators; the worker's own
	// certificate is signed by the coordinators when it registers, and
	// renewed before it expires. nil only with InsecurePlaintext.
	TLS *tlsutil.Credentials
	// InsecurePlaintext runs without TLS (tests of that mode, debugging).
	InsecurePlaintext bool
	// HTTPAddr, when set, is where the worker serves /metrics, /healthz
	// and /readyz (host:port; port 0 picks one).
	HTTPAddr string
	// SensorWindow is the window of the health manager's sensors: every
	// task's rates, busy share, backpressure and key sample are measured
	// over windows this long and sent to the leader as each closes (0:
	// DefaultSensorWindow, one second).
	SensorWindow time.Duration
	// BufferTuples bounds each output stream's buffer in tuples (0: the
	// data plane's default, dataplane.DefaultMaxTuples).
	BufferTuples int
	// CostScale multiplies the calibrated cost of every operator run here
	// (0: 1): a slow machine, for benchmarks of the health manager.
	CostScale float64
	// SourcePace, when set, scales the wall-clock pace of the generator
	// sources run here and may change while they run (benchmarks of the
	// health manager change a query's load with it; runtime.Pace).
	SourcePace *wrt.Pace
	// PaceFromOrigin: generators follow their query's pacing origin
	// (runtime Options.PaceFromOrigin; off by default).
	PaceFromOrigin bool
	// Faults, when set, injects network faults into the data plane (its
	// dials and its listener go through it); FaultsFile makes the worker
	// create one and apply the fault specification in that file
	// (dataplane.ParseFaults) whenever the file changes: failures by
	// hand. Neither set: no hook at all.
	Faults     *dataplane.Faults
	FaultsFile string
}

// ErrNoCoordinators is returned when the worker is given no coordinator address.
var ErrNoCoordinators = errors.New("no coordinator address given (--coordinators)")

// ErrNoTLS is returned when the worker has neither the org's CA nor the
// explicit plaintext flag.
var ErrNoTLS = errors.New("TLS is required: give the org's CA certificate (tls-ca or tls-dir), or run with --insecure-plaintext")

// Worker is one worker process.
type Worker struct {
	cfg     Config
	logger  *slog.Logger
	runtime *wrt.Runtime
	// pool holds the connections of this worker's subscriptions; Run
	// closes it after the runtime.
	pool   *dataplane.Pool
	dpAuth *dataPlaneAuth

	lis  net.Listener
	grpc *grpc.Server
	// health is the data-plane port's gRPC health service: NOT_SERVING
	// until the worker is registered and serves, and again once it stops.
	health *health.Server
	// serving is true while the data-plane server runs.
	serving atomic.Bool
	// bytes counts the data plane's network traffic; ops serves metrics
	// and health over HTTP (see metrics.go).
	bytes byteCounts
	ops   *opshttp.Server
	// sensors hold the tasks' figures per sensor window until a heartbeat
	// delivers them (sensors.go).
	sensors *sensors
	// rcTimes notes when reconfiguration plans came and were
	// acknowledged (reconfig_timing.go).
	rcTimes rcTimes
	// noNotices: the coordinators do not serve NoteReconfigAcks (an
	// older version): acknowledgements go with the reports only.
	noNotices atomic.Bool
	// taskStates replaces runtime.States in noteAcks (tests).
	taskStates func() []wrt.TaskState

	mu       sync.Mutex
	conns    map[string]*grpc.ClientConn
	coords   []string // known coordinator gRPC addresses, preferred first
	id       string
	ttl      time.Duration
	regEpoch uint64 // bumps on every (re)registration
}

// New validates cfg and builds a worker.
func New(cfg Config) (*Worker, error) {
	if len(cfg.Coordinators) == 0 {
		return nil, ErrNoCoordinators
	}
	if (cfg.TLS == nil) != cfg.InsecurePlaintext {
		if cfg.TLS == nil {
			return nil, ErrNoTLS
		}
		return nil, errors.New("both TLS credentials and insecure-plaintext given: choose one")
	}
	if cfg.SensorWindow < 0 {
		return nil, fmt.Errorf("sensor window %s: want a positive duration such as 1s", cfg.SensorWindow)
	}
	if cfg.SensorWindow == 0 {
		cfg.SensorWindow = DefaultSensorWindow
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	if cfg.Cores <= 0 {
		cfg.Cores = runtime.NumCPU()
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Discard()
	}
	if cfg.Name == "" {
		cfg.Name, _ = os.Hostname()
	}
	if cfg.WatchWait <= 0 {
		cfg.WatchWait = 30 * time.Second
	}
	w := &Worker{
		cfg:     cfg,
		logger:  cfg.Logger.With("org", cfg.Org, "worker_name", cfg.Name),
		conns:   map[string]*grpc.ClientConn{},
		coords:  append([]string(nil), cfg.Coordinators...),
		sensors: newSensors(cfg.SensorWindow),
	}
	w.dpAuth = &dataPlaneAuth{
		org: cfg.Org, joinToken: cfg.JoinToken, open: cfg.JoinToken == "",
		tokens: newTokenCache(w.askOrg), peerIdentity: rpc.PeerIdentity, logger: w.logger,
	}
	var dial []grpc.DialOption
	if cfg.TLS != nil {
		// Subscriptions go to other workers of the org, and to a
		// coordinator of the org for a stream of a task at a partner org
		// (the coordinators relay the cross-org data plane).
		dial = append(dial, cfg.TLS.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker, rpc.RoleCoordinator}}))
		dial = append(dial, dataplane.TLSDialOptions()...)
	}
	// Tasks present the join token to the other workers' data planes: over
	// plaintext it is what makes them workers there (see dataPlaneAuth).
	if cfg.JoinToken != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(rpc.BearerToken(cfg.JoinToken)))
	}
	if cfg.FaultsFile != "" && cfg.Faults == nil {
		w.cfg.Faults = dataplane.NewFaults()
	}
	// The data plane's client connections count their bytes (after any
	// injected fault, so a cut link counts nothing).
	dialer := w.bytes.dial
	if faults := w.cfg.Faults; faults != nil {
		dialer = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := faults.Dial(ctx, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{conn, &w.bytes}, nil
		}
	}
	dial = append(dial, grpc.WithContextDialer(dialer))
	w.pool = dataplane.NewPool(dial...)
	// Snapshots (moves, replicas bootstrapping from a peer) are fetched
	// over connections of their own where the serving worker offers one
	// (runtime.BulkOptions): the same TLS, faults and byte counting as the
	// data plane's connections.
	bulk := wrt.BulkOptions{Dial: dialer}
	if cfg.TLS != nil {
		bulk.ClientTLS = cfg.TLS.ClientConfig(tlsutil.Peer{Roles: []string{rpc.RoleWorker}})
	}
	w.runtime = wrt.New(wrt.Options{Logger: w.logger, BoundaryInterval: cfg.BoundaryInterval, Pool: w.pool, MaxFuture: cfg.MaxFuture, StallAfter: cfg.StallAfter,
		DCAAKeepTuples: cfg.DCAAKeepTuples, InputPendingTuples: cfg.InputPendingTuples,
		Buffer: dataplane.BufferOptions{Lease: cfg.SubscriberLease, OverrunGrace: cfg.OverrunGrace, MaxTuples: cfg.BufferTuples}, Bulk: bulk, CostScale: cfg.CostScale,
		SourcePace: cfg.SourcePace, PaceFromOrigin: cfg.PaceFromOrigin})
	w.health = health.NewServer()
	w.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	w.ops = opshttp.New(w.logger)
	w.ops.Registry().MustRegister(collector{w})
	w.ops.SetReady(w.ready)
	return w, nil
}

// Listen opens the data-plane listener, and the HTTP server when
// Config.HTTPAddr is set, so Addr and HTTPAddr are known before Run.
func (w *Worker) Listen() error {
	if w.lis != nil {
		return nil
	}
	lis, err := net.Listen("tcp", w.cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("worker listen on %s: %w", w.cfg.GRPCAddr, err)
	}
	if w.cfg.HTTPAddr != "" {
		if err := w.ops.Start(w.cfg.HTTPAddr); err != nil {
			_ = lis.Close()
			return err
		}
		w.logger.Info("worker HTTP (metrics, health) listening", "http", w.ops.Addr())
	}
	if w.cfg.Faults != nil {
		lis = w.cfg.Faults.Listener(lis)
	}
	w.lis = countingListener{lis, &w.bytes}
	w.serveBulk()
	return nil
}

// serveBulk offers fast snapshot transfer (runtime.BulkOptions) on an
// ephemeral port of the data plane's host: other workers of the org that
// fetch a snapshot from this one connect there, with a worker certificate
// under mutual TLS, and present the one-time token their authorized
// FetchSnapshot call received. Without it (the port cannot be opened)
// snapshots cross over the FetchSnapshot stream, as they do to a fetcher
// that cannot reach the port.
func (w *Worker) serveBulk() {
	host, _, err := net.SplitHostPort(w.cfg.GRPCAddr)
	if err == nil {
		var lis net.Listener
		if lis, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err == nil {
			if w.cfg.Faults != nil {
				lis = w.cfg.Faults.Listener(lis)
			}
			var cfg *tls.Config
			if w.cfg.TLS != nil {
				// The org's workers only, as FetchSnapshot (rpc/authz).
				cfg = w.cfg.TLS.ServerConfig(tlsutil.Peer{Roles: []string{rpc.RoleWorker}}, false)
			}
			err = w.runtime.ServeBulk(countingListener{lis, &w.bytes}, cfg)
			if err == nil {
				w.logger.Info("fast snapshot transfer listening", "addr", lis.Addr().String())
				return
			}
		}
	}
	w.logger.Warn("fast snapshot transfer not offered: snapshots cross over the data plane stream", "err", err)
}

// Addr is the data-plane address.
func (w *Worker) Addr() string {
	if w.lis != nil {
		return w.lis.Addr().String()
	}
	return w.cfg.GRPCAddr
}

// ID is the id the org gave this worker ("" before registration).
func (w *Worker) ID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.id
}

// Runtime exposes the task runtime (tests, benchmarks).
func (w *Worker) Runtime() *wrt.Runtime { return w.runtime }

// Run keeps the worker registered, alive and in step with its
// assignments, and serves its data plane, until ctx is cancelled.
//
// Under mTLS the data plane can only serve once the worker has a
// certificate, which it gets by registering: so it listens first (its
// address goes into the registration), registers, and then serves.
// Connections that arrive in between wait in the listen backlog; none are
// expected, since no task is placed on a worker before it registers.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Listen(); err != nil {
		return err
	}
	if w.cfg.InsecurePlaintext {
		w.logger.Warn("INSECURE: worker running with --insecure-plaintext: its data plane and its calls to the coordinators are unencrypted and unauthenticated")
	}
	if w.dpAuth.open {
		w.logger.Warn("data plane accepts every caller: no join token configured (dev mode); anyone who can reach " + w.Addr() + " can read results, ingest and acknowledge")
	}
	w.grpc = w.newServer()
	var wg sync.WaitGroup
	defer func() {
		w.health.Shutdown() // NOT_SERVING from here on
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = w.runtime.Close(closeCtx)
		_ = w.ops.Close(closeCtx)
		cancel()
		_ = w.pool.Close()
		w.grpc.Stop()
		_ = w.lis.Close()
		wg.Wait()
		w.mu.Lock()
		for _, c := range w.conns {
			_ = c.Close()
		}
		w.mu.Unlock()
	}()

	if err := w.register(ctx); err != nil {
		return err
	}
	wg.Add(1)
	w.serving.Store(true)
	w.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	go func() {
		defer wg.Done()
		defer w.serving.Store(false)
		if err := w.grpc.Serve(w.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) && ctx.Err() == nil {
			w.logger.Error("data plane server stopped", "err", err)
		}
	}()
	loops := []func(context.Context){w.sensorLoop, w.heartbeatLoop, w.watchLoop, w.reportLoop}
	if w.cfg.TLS != nil {
		loops = append(loops, w.renewLoop)
	}
	if w.cfg.FaultsFile != "" {
		w.logger.Warn("FAULT INJECTION: the data plane obeys the fault file", "file", w.cfg.FaultsFile)
		loops = append(loops, func(ctx context.Context) {
			w.cfg.Faults.Watch(ctx, w.cfg.FaultsFile, 250*time.Millisecond, func(err error) {
				w.logger.Error("fault file", "file", w.cfg.FaultsFile, "err", err)
			})
		})
	}
	var lw sync.WaitGroup
	for _, l := range loops {
		lw.Add(1)
		go func() { defer lw.Done(); l(ctx) }()
	}
	lw.Wait()
	return nil
}

// newServer builds the data-plane gRPC server: mutual TLS (other workers
// of the org and its clients) unless plaintext, the agreed keepalive
// policy, and the data-plane authorisation in front of every call.
func (w *Worker) newServer() *grpc.Server {
	opts := append(dataplane.ServerOptions(), rpc.ServerOptions()...)
	if w.cfg.TLS != nil {
		// Other workers subscribe; clients (tail, ingest) too; and the
		// org's coordinators, relaying a partner org's reads.
		opts = append(opts, w.cfg.TLS.ServerOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker, rpc.RoleClient, rpc.RoleCoordinator}}, false))
		opts = append(opts, dataplane.TLSServerOptions()...)
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(w.dpAuth.unary), grpc.ChainStreamInterceptor(w.dpAuth.stream))
	srv := grpc.NewServer(opts...)
	pb.RegisterDataPlaneServer(srv, w.runtime.Server())
	healthpb.RegisterHealthServer(srv, w.health)
	reflection.Register(srv)
	return srv
}

func (w *Worker) conn(addr string) (*grpc.ClientConn, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.conns[addr]; ok {
		return c, nil
	}
	var opts []grpc.DialOption
	if w.cfg.TLS != nil {
		opts = append(opts, w.cfg.TLS.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}}))
	}
	c, err := rpc.Dial(addr, w.cfg.JoinToken, opts...)
	if err != nil {
		return nil, err
	}
	w.conns[addr] = c
	return c, nil
}

// retryable reports whether another coordinator may succeed where this one failed.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// call runs f against the known coordinators in turn until one answers
// with something other than a transport-level failure. The one that
// answered moves to the front of the list.
func (w *Worker) call(ctx context.Context, timeout time.Duration, f func(ctx context.Context, c pb.WorkerServiceClient) error) error {
	return w.callConn(ctx, timeout, func(ctx context.Context, conn *grpc.ClientConn) error {
		return f(ctx, pb.NewWorkerServiceClient(conn))
	})
}

// callConn is call for any service of the coordinators.
func (w *Worker) callConn(ctx context.Context, timeout time.Duration, f func(ctx context.Context, conn *grpc.ClientConn) error) error {
	w.mu.Lock()
	coords := append([]string(nil), w.coords...)
	w.mu.Unlock()
	var last error
	for _, addr := range coords {
		conn, err := w.conn(addr)
		if err != nil {
			last = err
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err = f(cctx, conn)
		cancel()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			if err == nil {
				w.prefer(addr)
			}
			return err
		}
		last = fmt.Errorf("coordinator %s: %w", addr, err)
	}
	return last
}

func (w *Worker) prefer(addr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, a := range w.coords {
		if a == addr {
			copy(w.coords[1:i+1], w.coords[:i])
			w.coords[0] = addr
			return
		}
	}
}

// learn merges coordinator addresses reported by the org.
func (w *Worker) learn(addrs []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range w.coords {
		seen[a] = true
	}
	for _, a := range addrs {
		if a != "" && !seen[a] {
			w.coords = append(w.coords, a)
			seen[a] = true
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// agentRetry paces the agent's retries of calls to the org's coordinators.
var agentRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// register obtains a worker id, retrying (with backoff) across coordinators.
// A registration that may or may not have committed is retried with the
// same idempotency key, so it yields one worker.
func (w *Worker) register(ctx context.Context) error {
	key := fmt.Sprintf("%s/%s/%d", w.cfg.Name, w.Addr(), time.Now().UnixNano())
	backoff := agentRetry.New()
	var csr, keyPEM []byte
	if w.cfg.TLS != nil {
		var err error
		if csr, keyPEM, err = tlsutil.NewCSR(); err != nil {
			return fmt.Errorf("worker key: %w", err)
		}
	}
	for {
		var resp *pb.RegisterResponse
		err := w.call(ctx, 10*time.Second, func(ctx context.Context, c pb.WorkerServiceClient) error {
			var err error
			resp, err = c.Register(ctx, &pb.RegisterRequest{
				Addr: w.Addr(), Cores: int32(w.cfg.Cores), Labels: w.cfg.Labels, Name: w.cfg.Name, IdempotencyKey: key,
				Csr: csr, DataplaneLevel: rpc.DataPlaneLevel,
			})
			return err
		})
		if err == nil && w.cfg.TLS != nil {
			if err = w.installCertificate(resp.Certificate, keyPEM, resp.WorkerId); err != nil {
				return fmt.Errorf("register: %w", err)
			}
		}
		if err == nil {
			w.mu.Lock()
			w.id = resp.WorkerId
			w.ttl = time.Duration(resp.HeartbeatTtlMs) * time.Millisecond
			w.regEpoch++
			w.mu.Unlock()
			w.learn(resp.Coordinators)
			w.logger.Info("registered with org", "worker", resp.WorkerId, "addr", w.Addr(), "heartbeat_ttl", w.ttl)
			return nil
		}
		if code := status.Code(err); code == codes.Unauthenticated || code == codes.PermissionDenied || code == codes.InvalidArgument {
			return fmt.Errorf("register refused: %w", err)
		}
		w.logger.Warn("register failed; retrying", "err", err)
		if err := backoff.Wait(ctx); err != nil {
			return err
		}
	}
}

// reregister replaces the worker's identity after the org said it does not
// know it, unless another loop already did so since epoch.
func (w *Worker) reregister(ctx context.Context, epoch uint64) {
	w.mu.Lock()
	done := w.regEpoch != epoch
	w.mu.Unlock()
	if done {
		return
	}
	w.logger.Warn("coordinator does not know this worker; registering again")
	if err := w.register(ctx); err != nil && ctx.Err() == nil {
		w.logger.Error("re-registration failed", "err", err)
	}
}

func (w *Worker) identity() (string, time.Duration, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.id, w.ttl, w.regEpoch
}

func (w *Worker) heartbeatLoop(ctx context.Context) {
	for {
		id, ttl, epoch := w.identity()
		interval := max(ttl/4, 50*time.Millisecond)
		// A heartbeat goes at least every quarter of the TTL, and as soon
		// as a sensor window closes, so the leader sees every window.
		timer := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-w.sensors.closed:
			timer.Stop()
		}
		stats, rounds := w.sensors.report()
		req := &pb.HeartbeatRequest{WorkerId: id, TaskStats: stats}
		err := w.call(ctx, max(ttl/2, time.Second), func(ctx context.Context, c pb.WorkerServiceClient) error {
			resp, err := c.Heartbeat(ctx, req)
			if err == nil {
				w.learn(resp.Coordinators)
				w.noteReplicaStates(resp.ReplicaStates, time.Now())
			}
			return err
		})
		switch {
		case err == nil:
			w.sensors.delivered(rounds)
		case status.Code(err) == codes.NotFound:
			w.reregister(ctx, epoch)
		case ctx.Err() == nil:
			w.logger.Warn("heartbeat failed on every known coordinator", "err", err)
		}
	}
}

// noteReplicaStates hands the coordinator's DCAA replica states (a
// heartbeat answer's) to the runtime's tasks as hints.
func (w *Worker) noteReplicaStates(hs []*pb.ReplicaStateHint, received time.Time) {
	if len(hs) == 0 {
		return
	}
	hints := make([]wrt.ReplicaStateHint, 0, len(hs))
	for _, h := range hs {
		hints = append(hints, wrt.ReplicaStateHint{TaskID: h.TaskId, Generation: int(h.Generation), State: h.State, Age: time.Duration(h.AgeMs) * time.Millisecond})
	}
	w.runtime.NoteReplicaStates(hints, received)
}

// watchLoop long-polls the assignment set and applies each new one.
func (w *Worker) watchLoop(ctx context.Context) {
	var index uint64
	var lastEpoch uint64
	var parsed specCache
	backoff := agentRetry.New()
	for ctx.Err() == nil {
		id, _, epoch := w.identity()
		if epoch != lastEpoch {
			index, lastEpoch = 0, epoch
		}
		var resp *pb.WatchAssignmentsResponse
		err := w.call(ctx, w.cfg.WatchWait+10*time.Second, func(ctx context.Context, c pb.WorkerServiceClient) error {
			var err error
			resp, err = c.WatchAssignments(ctx, &pb.WatchAssignmentsRequest{WorkerId: id, MinIndex: index, MaxWaitMs: w.cfg.WatchWait.Milliseconds(),
				ReconfigPlans: true, ReconfigPlansHave: parsed.have()})
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if status.Code(err) == codes.NotFound {
				w.reregister(ctx, epoch)
				continue
			}
			w.logger.Warn("assignment watch failed; retrying", "err", err)
			if backoff.Wait(ctx) != nil {
				return
			}
			continue
		}
		got := time.Now()
		backoff.Reset()
		if resp.Index == index {
			continue // max wait elapsed without change
		}
		specs, err := taskSpecs(resp, &parsed)
		if errors.Is(err, errPlanMissing) {
			w.logger.Warn("assignment watch: asking again for every reconfiguration plan", "err", err)
			parsed.forget()
			index = 0
			continue
		}
		index = resp.Index
		if err != nil {
			w.logger.Error("assignment carries a query this worker cannot run", "err", err)
		}
		w.rcTimes.received(specs, got)
		names := make([]string, 0, len(resp.Assignments))
		for _, a := range resp.Assignments {
			names = append(names, a.TaskId)
		}
		sort.Strings(names)
		w.logger.Info("assignments changed", "index", index, "tasks", len(names), "task_ids", strings.Join(names, ","))
		before := len(w.runtime.States())
		w.runtime.Apply(ctx, specs)
		if len(w.runtime.States()) < before {
			// Stopped tasks' buffers are garbage now, but the Go runtime
			// returns freed memory to the OS only gradually (and a worker
			// runs with a high GC target): without this a worker whose
			// query stopped kept its peak resident size.
			debug.FreeOSMemory()
		}
	}
}

// specCache holds the query definitions of the last watch response,
// parsed, by their JSON. Every assignment change repeats the definitions
// of all the worker's queries, and parsing one validates it and compiles
// its expressions: each phase of a reconfiguration plan (loading,
// switched, complete) reparsed every query on every worker, on the path
// of the plan's acknowledgements and competing with the tasks for the
// CPU. A parsed definition is read-only, so the tasks started from
// several responses may share it as those of one response do.
type specCache struct {
	byJSON map[string]*queryspec.Query
	// plans holds the reconfiguration plans of the last response,
	// decoded, by their JSON (QueryView.reconfig_plans_json): a plan's
	// JSON changes only with its phase, so a response decodes only the
	// plans that changed, not the query's whole history. A decoded plan
	// is read-only: its byte slices are shared by every response that
	// had it.
	plans map[string]fsm.ReconfigPlan
	// byDigest holds the same plans by the digests the coordinator
	// gave them (QueryView.reconfig_plan_digests): the next request
	// names them (reconfig_plans_have), and the coordinator leaves out
	// their JSON.
	byDigest map[uint64]fsm.ReconfigPlan
}

// errPlanMissing: a response left out the JSON of a plan this worker does
// not hold (it should not happen: the worker names only plans it holds).
// The worker watches again from scratch rather than run without it.
var errPlanMissing = errors.New("a reconfiguration plan left out of the response is not held here")

// have is the digests of the plans the cache holds (the last response's).
func (c *specCache) have() []uint64 {
	out := make([]uint64, 0, len(c.byDigest))
	for d := range c.byDigest {
		out = append(out, d)
	}
	return out
}

// forget drops every plan held: the next request names none.
func (c *specCache) forget() {
	c.plans, c.byDigest = nil, nil
}

// reconfigOf returns the reconfiguration state q carries (nil: none):
// split by plan (reconfig_plans_json), decoding only the plans the last
// response (or this one) did not have, or as one JSON document (a
// coordinator that does not split it, or a partner org's copy).
func (c *specCache) reconfigOf(q *pb.QueryView, keep map[string]fsm.ReconfigPlan, keepDigests map[uint64]fsm.ReconfigPlan) (*fsm.QueryReconfig, error) {
	if q.ReconfigState {
		rc := &fsm.QueryReconfig{Tracking: q.ReconfigTracking, Plans: make([]fsm.ReconfigPlan, len(q.ReconfigPlansJson))}
		digests := q.ReconfigPlanDigests
		if len(digests) != len(q.ReconfigPlansJson) {
			digests = nil // a coordinator that sends none
		}
		for i, b := range q.ReconfigPlansJson {
			var p fsm.ReconfigPlan
			switch ok := false; {
			case len(b) == 0 && digests != nil:
				// Left out: held from the last response.
				if p, ok = c.byDigest[digests[i]]; !ok {
					if p, ok = keepDigests[digests[i]]; !ok {
						return nil, fmt.Errorf("plan %d: %w", i+1, errPlanMissing)
					}
				}
			default:
				if p, ok = keep[string(b)]; !ok {
					if p, ok = c.plans[string(b)]; !ok {
						if err := json.Unmarshal(b, &p); err != nil {
							return nil, fmt.Errorf("plan %d: %w", i+1, err)
						}
					}
					keep[string(b)] = p
				}
			}
			if digests != nil {
				keepDigests[digests[i]] = p
			}
			rc.Plans[i] = p
		}
		return rc, nil
	}
	if len(q.ReconfigJson) == 0 {
		return nil, nil
	}
	var rc fsm.QueryReconfig
	if err := json.Unmarshal(q.ReconfigJson, &rc); err != nil {
		return nil, err
	}
	return &rc, nil
}

// parse returns the definition spec parsed, from the cache when the last
// response (or this one) had it; keep marks it as used by this response.
func (c *specCache) parse(spec []byte, keep map[string]*queryspec.Query) (*queryspec.Query, error) {
	if q, ok := keep[string(spec)]; ok {
		return q, nil
	}
	q, ok := c.byJSON[string(spec)]
	if !ok {
		var err error
		if q, err = queryspec.FromJSON(spec); err != nil {
			return nil, err
		}
	}
	keep[string(spec)] = q
	return q, nil
}

// taskSpecs turns a watch response into runtime task specs. Queries whose
// spec cannot be decoded are skipped (and reported); the rest still run.
// cache (nil: none) keeps the parsed definitions for the next response.
func taskSpecs(resp *pb.WatchAssignmentsResponse, cache *specCache) ([]wrt.TaskSpec, error) {
	if cache == nil {
		cache = &specCache{}
	}
	keep := map[string]*queryspec.Query{}
	keepPlans := map[string]fsm.ReconfigPlan{}
	keepDigests := map[uint64]fsm.ReconfigPlan{}
	defer func() { cache.byJSON, cache.plans, cache.byDigest = keep, keepPlans, keepDigests }()
	type qinfo struct {
		spec       *queryspec.Query
		placements []wrt.Placement
		slotMaps   map[string]*wrt.SlotMap
		reconfig   *fsm.QueryReconfig
		paceOrigin time.Time
	}
	queries := map[string]*qinfo{}
	var errs []error
	for _, q := range resp.Queries {
		spec, err := cache.parse(q.SpecJson, keep)
		if err != nil {
			errs = append(errs, fmt.Errorf("query %s: %w", q.Name, err))
			continue
		}
		qi := &qinfo{spec: spec}
		if q.PaceOriginUnixNano != 0 {
			qi.paceOrigin = time.Unix(0, q.PaceOriginUnixNano)
		}
		rc, err := cache.reconfigOf(q, keepPlans, keepDigests)
		if errors.Is(err, errPlanMissing) {
			// Running without the query's plans would stop its tasks
			// here: the caller watches again, naming no plan.
			return nil, fmt.Errorf("query %s: %w", q.Name, err)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("query %s: reconfiguration: %w", q.Name, err))
			continue
		}
		qi.reconfig = rc
		for _, t := range q.Tasks {
			qi.placements = append(qi.placements, wrt.Placement{
				TaskID: t.TaskId, Fragment: t.Fragment, Partition: int(t.Partition), Replica: int(t.Replica),
				Generation: int(max(t.Generation, 1)), WorkerAddr: t.WorkerAddr,
			})
		}
		for _, m := range q.SlotMaps {
			sm, err := slotMapOf(m)
			if err != nil {
				errs = append(errs, fmt.Errorf("query %s: %w", q.Name, err))
				continue
			}
			if qi.slotMaps == nil {
				qi.slotMaps = map[string]*wrt.SlotMap{}
			}
			qi.slotMaps[m.Fragment] = sm
		}
		queries[q.Name] = qi
	}
	var specs []wrt.TaskSpec
	for _, a := range resp.Assignments {
		qi := queries[a.Query]
		if qi == nil {
			continue
		}
		spec := wrt.TaskSpec{
			TaskID: a.TaskId, Query: a.Query, Fragment: a.Fragment,
			Partition: int(a.Partition), Replica: int(a.Replica), QueryIndex: a.QueryIndex,
			Spec: qi.spec, Placements: qi.placements, SlotMaps: qi.slotMaps,
			Generation: int(max(a.Generation, 1)), SlotEpoch: a.SlotEpoch,
			// The old copy of a live move, or its new copy (whose
			// bootstrap source is a copy of the same task; a peer
			// replica's has another id).
			InMove:    a.MovingOut || (a.Bootstrap != nil && a.Bootstrap.TaskId == a.TaskId),
			MovingOut: a.MovingOut, AssignIndex: resp.Index,
			Reconfig: qi.reconfig, MarkersExpected: int(a.MarkersExpected),
			PaceOrigin: qi.paceOrigin,
		}
		if a.ReconfigKeptFrontier != 0 || len(a.ReconfigKeptSwitches) > 0 {
			k := &fsm.ReconfigKept{Frontier: a.ReconfigKeptFrontier}
			for _, sw := range a.ReconfigKeptSwitches {
				k.Switches = append(k.Switches, fsm.ReconfigSwitch{Epoch: sw.Epoch, At: sw.At})
			}
			spec.ReconfigKept = k
		}
		if b := a.Bootstrap; b != nil && b.WorkerAddr != "" {
			spec.Bootstrap = &wrt.SnapshotSource{WorkerAddr: b.WorkerAddr, TaskID: b.TaskId, Generation: int(b.Generation), Halt: b.Halt,
				Timeout: time.Duration(max(b.TimeoutMs, 0)) * time.Millisecond, SourceDown: b.SourceDown}
		}
		for _, r := range a.Slots {
			spec.Slots = append(spec.Slots, wrt.SlotRange{First: int(r.First), Last: int(r.Last)})
		}
		specs = append(specs, spec)
	}
	return specs, errors.Join(errs...)
}

// slotMapOf expands a slot map from its ranges into one owner per slot,
// with the rescale under way if there is one.
func slotMapOf(m *pb.SlotMap) (*wrt.SlotMap, error) {
	owner, err := ownersOf(m, m.Ranges)
	if err != nil {
		return nil, err
	}
	sm := &wrt.SlotMap{Epoch: m.Epoch, Partitions: int(m.Partitions), Owner: owner, Starts: m.Starts}
	if m.NextEpoch != 0 {
		next, err := ownersOf(m, m.NextRanges)
		if err != nil {
			return nil, fmt.Errorf("rescale to epoch %d: %w", m.NextEpoch, err)
		}
		sm.Next = &wrt.SlotMapNext{Epoch: m.NextEpoch, Partitions: int(m.NextPartitions), Owner: next, Go: m.NextGo, Cut: m.Cut}
	}
	return sm, nil
}

func ownersOf(m *pb.SlotMap, ranges []*pb.SlotRange) ([]int32, error) {
	owner := make([]int32, queryspec.NumSlots)
	next := uint32(0)
	for _, r := range ranges {
		if r.First != next || r.Last < r.First || r.Last >= queryspec.NumSlots {
			return nil, fmt.Errorf("slot map of %s (epoch %d): range %d..%d does not continue from slot %d", m.Fragment, m.Epoch, r.First, r.Last, next)
		}
		for s := r.First; s <= r.Last; s++ {
			owner[s] = r.Partition
		}
		next = r.Last + 1
	}
	if next != queryspec.NumSlots {
		return nil, fmt.Errorf("slot map of %s (epoch %d) covers slots 0..%d of %d", m.Fragment, m.Epoch, int(next)-1, queryspec.NumSlots)
	}
	return owner, nil
}

// reconfigSettleMax bounds how long a report waits for the worker's
// tasks to install a reconfiguration plan they were handed
// (awaitReconfigSettled): a few boundary intervals, within which every
// running task installs it.
const reconfigSettleMax = 20 * time.Millisecond

// awaitReconfigSettled holds a report, for reconfigSettleMax at most,
// while the runtime is still installing a reconfiguration plan in its
// tasks, so that one report (one Raft write) acknowledges it for all of
// them. Without it the first task to install the plan sent a report
// alone, and the others' waited for that Raft write before theirs could
// go: two sequential writes on the path of every plan (a plan switches
// when the last task's acknowledgement is applied).
func (w *Worker) awaitReconfigSettled(ctx context.Context) {
	if !w.runtime.ReconfigSettling() {
		return
	}
	limit := time.NewTimer(reconfigSettleMax)
	defer limit.Stop()
	// Installs signal ProgressChanged; the ticker covers a task that
	// stopped without installing.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for w.runtime.ReconfigSettling() {
		select {
		case <-ctx.Done():
			return
		case <-limit.C:
			return
		case <-w.runtime.ProgressChanged():
		case <-tick.C:
		}
	}
}

// reportLoop tells the org about task state changes: every 250ms, or
// every 50ms while a task here takes part in a live move, whose consumers
// switch once the coordinator sees the new copy's position reach the old
// copy's (a stale position of the old copy would switch them to a new
// copy still behind what they have read).
func (w *Worker) reportLoop(ctx context.Context) {
	last := map[string]wrt.TaskState{}
	// acked is the newest plan each task's acknowledgement of which left
	// here (in a report or a notice).
	acked := ackedSent{}
	interval := 250 * time.Millisecond
	timer := time.NewTimer(interval)
	defer timer.Stop()
	// again: a progress signal came while the last report was in flight
	// (reportNoting took it): report again at once.
	again := false
	for {
		if again {
			again = false
			w.awaitReconfigSettled(ctx)
		} else {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			case <-w.runtime.ProgressChanged():
				// A reconfiguration step: the coordinator waits for it.
				w.awaitReconfigSettled(ctx)
			}
		}
		if ctx.Err() != nil {
			return
		}
		// Reset discards a value the timer may hold (Go 1.23 timers).
		timer.Reset(interval)
		id, _, epoch := w.identity()
		cur := map[string]wrt.TaskState{}
		var changed, acks []*pb.TaskState
		interval = 250 * time.Millisecond
		for _, st := range w.runtime.States() {
			if st.InMove {
				interval = 50 * time.Millisecond
			}
			cur[st.TaskID] = st
			if prev, ok := last[st.TaskID]; !ok || prev != st {
				ts := &pb.TaskState{TaskId: st.TaskID, State: st.State, Message: st.Message, Generation: int32(st.Generation),
					ReplicaState: st.Replica, Tentative: st.Tentative, Lossy: st.Lossy,
					Prepared: st.Prepared, Frontier: st.Frontier, CutDone: st.CutDone}
				if st.InMove {
					ts.MovePosition, ts.MoveBlocked = &st.Position, st.Blocked
				}
				if st.Reconfig {
					if st.ReconfigAcked > prev.ReconfigAcked {
						acks = append(acks, ts)
					}
					ts.Reconfig = &pb.ReconfigProgress{Acked: st.ReconfigAcked, Level: st.ReconfigLevel, Frontier: st.ReconfigFrontier}
					for _, m := range st.ReconfigMarkers {
						if m.Epoch != 0 {
							ts.Reconfig.Markers = append(ts.Reconfig.Markers, &pb.ReconfigMarkers{Epoch: m.Epoch, Seen: int32(m.Seen), Expected: int32(m.Expected)})
						}
					}
					for _, sw := range st.ReconfigSwitches {
						if sw.Epoch != 0 {
							ts.Reconfig.Switches = append(ts.Reconfig.Switches, &pb.ReconfigSwitch{Epoch: sw.Epoch, At: sw.At})
						}
					}
				}
				changed = append(changed, ts)
			}
		}
		if len(changed) == 0 {
			last = cur
			continue
		}
		sent := time.Now()
		for _, ts := range acks {
			if acked.add(ts.TaskId, int(ts.Generation), ts.Reconfig.Acked) {
				w.rcTimes.reported(ts.TaskId, ts.Reconfig.Acked, sent)
			}
		}
		for id := range acked {
			if _, ok := cur[id]; !ok {
				delete(acked, id)
			}
		}
		var err error
		again = w.reportNoting(ctx, id, acked, func() {
			err = w.call(ctx, 5*time.Second, func(ctx context.Context, c pb.WorkerServiceClient) error {
				_, err := c.ReportTasks(ctx, &pb.ReportTasksRequest{WorkerId: id, Tasks: changed})
				return err
			})
		})
		switch {
		case err == nil:
			last = cur
		case status.Code(err) == codes.NotFound:
			w.reregister(ctx, epoch)
			last = map[string]wrt.TaskState{}
		}
	}
}

// reportNoting runs report (a ReportTasks call, which returns once the
// leader wrote the report in Raft) and, while it runs, sends the leader
// the acknowledgements of plans the tasks install meanwhile
// (NoteReconfigAcks), so that they do not wait for that write and the
// next report's: the periodic report is in flight about one plan in ten,
// and a plan is done when the leader holds every task's acknowledgement.
// The report that follows (again) records them in Raft. acked is the
// newest acknowledgement of each task sent; reportNoting adds what it
// notices (its goroutine owns acked until report returned and it ended).
// again reports whether it took a progress signal of the runtime: the
// caller reports at once.
func (w *Worker) reportNoting(ctx context.Context, id string, acked ackedSent, report func()) (again bool) {
	if w.noNotices.Load() {
		report()
		return false
	}
	nctx, cancel := context.WithCancel(ctx)
	took := make(chan bool, 1)
	go func() {
		got := false
		defer func() { took <- got }()
		for {
			select {
			case <-nctx.Done():
				return
			case <-w.runtime.ProgressChanged():
				got = true
			}
			w.awaitReconfigSettled(nctx)
			if nctx.Err() != nil {
				return
			}
			// A notice still under way when the report returns is cut:
			// the report the caller sends at once (again) carries its
			// acknowledgements.
			w.noteAcks(nctx, id, acked)
		}
	}()
	report()
	cancel()
	return <-took
}

// noteAcks sends the leader the acknowledgements of the tasks here that
// acked (what left already) does not have, and adds them to it.
func (w *Worker) noteAcks(ctx context.Context, id string, acked ackedSent) {
	var notes []*pb.TaskState
	states := w.runtime.States
	if w.taskStates != nil {
		states = w.taskStates
	}
	for _, st := range states() {
		if st.Reconfig && acked.isNew(st.TaskID, st.Generation, st.ReconfigAcked) {
			notes = append(notes, &pb.TaskState{TaskId: st.TaskID, Generation: int32(st.Generation),
				Reconfig: &pb.ReconfigProgress{Acked: st.ReconfigAcked}})
		}
	}
	if len(notes) == 0 {
		return
	}
	sent := time.Now()
	err := w.call(ctx, 5*time.Second, func(ctx context.Context, c pb.WorkerServiceClient) error {
		_, err := c.NoteReconfigAcks(ctx, &pb.ReportTasksRequest{WorkerId: id, Tasks: notes})
		return err
	})
	if status.Code(err) == codes.Unimplemented {
		w.noNotices.Store(true)
		w.logger.Info("the coordinators take acknowledgements with the reports only (an older version)")
		return
	}
	if err != nil {
		// The report that follows carries them.
		w.logger.Debug("reconfiguration acknowledgements not noted ahead of the report", "err", err)
		return
	}
	for _, t := range notes {
		if acked.add(t.TaskId, int(t.Generation), t.Reconfig.Acked) {
			w.rcTimes.reported(t.TaskId, t.Reconfig.Acked, sent)
		}
	}
}

// ackedSent is, by task id, the newest reconfiguration plan whose
// acknowledgement by the task's copy (generation) left this worker.
type ackedSent map[string]sentAck

type sentAck struct {
	gen   int
	epoch uint64
}

// isNew reports whether copy gen of task id acknowledging epoch is news
// to the leader (a new copy's acknowledgements all are).
func (a ackedSent) isNew(id string, gen int, epoch uint64) bool {
	p, ok := a[id]
	return epoch > 0 && (!ok || p.gen != gen || epoch > p.epoch)
}

// add notes that copy gen of task id's acknowledgement of epoch left;
// it reports whether that was news (isNew).
func (a ackedSent) add(id string, gen int, epoch uint64) bool {
	if !a.isNew(id, gen, epoch) {
		return false
	}
	a[id] = sentAck{gen, epoch}
	return true
}
