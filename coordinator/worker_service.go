package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// workerService serves the workers of the org.
type workerService struct {
	pb.UnimplementedWorkerServiceServer
	s *Server
}

const workerMethod = "/fedstream.v1.WorkerService/"

func newID(prefix string) string {
	var b [6]byte
	// crypto/rand.Read never returns an error (it aborts the program if
	// the system's source fails), so there is none to handle.
	rand.Read(b[:]) //nolint:errcheck
	return prefix + hex.EncodeToString(b[:])
}

func (ws *workerService) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	s := ws.s
	if req.Addr == "" {
		return nil, status.Error(codes.InvalidArgument, "register: addr is required (the worker's data-plane address)")
	}
	if s.cfg.TLS != nil {
		if len(req.Csr) == 0 {
			return nil, status.Error(codes.InvalidArgument, "register: csr is required: the org runs mutual TLS and the worker needs a certificate (is the worker running with --insecure-plaintext?)")
		}
		if err := checkCSR(req.Csr); err != nil {
			return nil, err
		}
	}
	resp := &pb.RegisterResponse{}
	if handled, err := s.leaderOrForward(ctx, workerMethod+"Register", req, resp); handled {
		return resp, err
	}
	if s.cfg.TLS != nil && s.cfg.CA == nil {
		// Refused before anything is committed: the leader signs.
		return nil, errNoCAKey
	}
	key := req.IdempotencyKey
	id := newID("w-")
	if key == "" {
		key = "register/" + id
	}
	cores := req.Cores
	if cores <= 0 {
		cores = 1
	}
	// This leader hears from the worker before its record commits: a new
	// leader's set-up marks every ready worker it has not heard from
	// unknown, and it may read the record between the commit and the
	// touch below (after signing); the worker then showed unknown until
	// its next heartbeat. Its heartbeat deadline still starts at the
	// touch: one started here could pass while a slow commit is pending,
	// and expireWorkers would mark the new worker down.
	s.liveness.hear(id)
	res, err := s.apply(ctx, fsm.RegisterWorkerType, fsm.RegisterWorkerRequest{
		Worker: fsm.Worker{
			ID: id, Name: req.Name, Org: s.cfg.Org, Addr: req.Addr,
			Cores: cores, Labels: req.Labels, Status: statusReady,
			DataPlaneLevel: max(req.DataplaneLevel, 0),
		},
		IdempotencyKey: "register/" + key,
		// A worker registering at the address of an older record is that
		// worker restarted (two processes cannot serve one address): the
		// old record goes and its tasks are placed again.
		ReplaceSameAddr: true,
		At:              time.Now().UnixNano(),
	})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "register: %v", res.Err)
	}
	if v, ok := res.Value.(string); ok && v != "" {
		id = v
	}
	var cert []byte
	if s.cfg.TLS != nil {
		if cert, err = s.signWorker(req.Csr, id, req.Addr); err != nil {
			return nil, err
		}
	}
	ttl := s.cfg.Timings.HeartbeatTTL
	s.liveness.touch(id, time.Now().Add(ttl))
	s.logger.Info("worker registered", "worker", id, "addr", req.Addr, "cores", cores, "dataplane_level", req.DataplaneLevel)
	return &pb.RegisterResponse{WorkerId: id, HeartbeatTtlMs: ttl.Milliseconds(), Coordinators: s.coordinatorAddrs(), Certificate: cert}, nil
}

// RenewCertificate signs a new certificate for a registered worker that
// proves who it is with its current, still valid, certificate. Any
// coordinator holding the CA key answers; nothing is committed.
func (ws *workerService) RenewCertificate(ctx context.Context, req *pb.RenewCertificateRequest) (*pb.RenewCertificateResponse, error) {
	s := ws.s
	if s.cfg.TLS == nil {
		return nil, status.Error(codes.FailedPrecondition, "renew certificate: this coordinator runs without TLS (--insecure-plaintext)")
	}
	id, ok := rpc.PeerIdentity(ctx)
	if !ok || id.Org != s.cfg.Org || id.Role != rpc.RoleWorker || id.Name != req.WorkerId {
		return nil, status.Errorf(codes.PermissionDenied, "renew certificate: only worker %q itself, with its current certificate, may renew it", req.WorkerId)
	}
	if err := checkCSR(req.Csr); err != nil {
		return nil, err
	}
	w, err := s.State().Worker(nil, req.WorkerId)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "renew certificate: %v", err)
	}
	if w == nil {
		return nil, errUnknownWorker(req.WorkerId)
	}
	cert, err := s.signWorker(req.Csr, w.ID, w.Addr)
	if err != nil {
		return nil, err
	}
	s.logger.Debug("worker certificate renewed", "worker", w.ID)
	return &pb.RenewCertificateResponse{Certificate: cert}, nil
}

// checkWorker is nil when worker id is registered, else the error that
// answers its call (what names the call).
func (s *Server) checkWorker(id, what string) error {
	w, err := s.State().Worker(nil, id)
	if err != nil {
		return status.Errorf(codes.Internal, "%s: read worker %s: %v", what, id, err)
	}
	if w == nil {
		return errUnknownWorker(id)
	}
	return nil
}

// errUnknownWorker tells a worker to register again.
func errUnknownWorker(id string) error {
	return status.Errorf(codes.NotFound, "unknown worker %q: register again", id)
}

func (ws *workerService) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	s := ws.s
	resp := &pb.HeartbeatResponse{}
	if handled, err := s.leaderOrForward(ctx, workerMethod+"Heartbeat", req, resp); handled {
		return resp, err
	}
	if h := s.cfg.hooks.heartbeat; h != nil {
		if err := h(req.WorkerId); err != nil {
			return nil, err
		}
	}
	w, err := s.State().Worker(nil, req.WorkerId)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "heartbeat: %v", err)
	}
	if w == nil {
		return nil, errUnknownWorker(req.WorkerId)
	}
	ttl := s.cfg.Timings.HeartbeatTTL
	if w.Status != statusReady {
		// A worker that was declared down (paused, partitioned) and is back:
		// it becomes ready again and receives work on the next placement.
		s.logger.Info("worker is back; marking it ready", "worker", w.ID, "was", w.Status)
		res, err := s.apply(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: w.ID, Status: statusReady, At: time.Now().UnixNano()})
		if err != nil {
			return nil, err
		}
		if res.Err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "heartbeat: %v", res.Err)
		}
	}
	s.liveness.touch(w.ID, time.Now().Add(ttl))
	s.liveStats.put(w.ID, req.TaskStats, time.Now())
	hints, err := s.replicaStateHints(w.ID, time.Now())
	if err != nil {
		s.logger.Warn("heartbeat: replica state hints left out", "worker", w.ID, "err", err)
	}
	return &pb.HeartbeatResponse{HeartbeatTtlMs: ttl.Milliseconds(), Coordinators: s.coordinatorAddrs(), ReplicaStates: hints}, nil
}

func (ws *workerService) ReportTasks(ctx context.Context, req *pb.ReportTasksRequest) (*pb.ReportTasksResponse, error) {
	s := ws.s
	resp := &pb.ReportTasksResponse{}
	if handled, err := s.leaderOrForward(ctx, workerMethod+"ReportTasks", req, resp); handled {
		return resp, err
	}
	if err := s.checkWorker(req.WorkerId, "report tasks"); err != nil {
		return nil, err
	}
	upd := fsm.UpdateTaskStatesRequest{WorkerID: req.WorkerId}
	// Copies of partners' tasks hosted here report to the leader's
	// memory, which the partner reads at its next sync.
	reports := s.takeHostedReports(req.WorkerId, req.Tasks)
	if len(reports) == 0 && len(req.Tasks) > 0 {
		return resp, nil
	}
	for _, t := range reports {
		u := fsm.TaskStateUpdate{TaskID: t.TaskId, State: t.State, Message: t.Message, Generation: int(t.Generation), Tentative: t.Tentative, Lossy: t.Lossy,
			Prepared: t.Prepared, Frontier: t.Frontier, CutDone: t.CutDone, MovePosition: t.MovePosition, MoveBlocked: t.MoveBlocked}
		if rp := t.Reconfig; rp != nil {
			u.Reconfig, u.ReconfigAcked, u.ReconfigLevel, u.ReconfigFrontier = true, rp.Acked, rp.Level, rp.Frontier
			for _, m := range rp.Markers {
				u.ReconfigMarkers = append(u.ReconfigMarkers, fsm.ReconfigMarkers{Epoch: m.Epoch, Seen: int(m.Seen), Expected: int(m.Expected)})
			}
			for _, sw := range rp.Switches {
				u.ReconfigSwitches = append(u.ReconfigSwitches, fsm.ReconfigSwitch{Epoch: sw.Epoch, At: sw.At})
			}
		}
		if t.ReplicaState != pb.ReplicaState_REPLICA_STATE_UNSPECIFIED {
			u.ReplicaState = t.ReplicaState.String()
			s.stateNews.note(t.TaskId, int(t.Generation), t.ReplicaState, time.Now())
		}
		upd.States = append(upd.States, u)
	}
	st := s.State()
	s.stateNews.prune(func(id string) bool { t, err := st.Task(nil, id); return err != nil || t != nil })
	upd.KeepReconfig = s.keepReconfig()
	hold := s.noteAcksReceived(req.WorkerId, reports)
	if err := s.writeReport(ctx, upd, hold); err != nil {
		return nil, err
	}
	return resp, nil
}

// keepReconfig reports whether a report's entry may keep every copy's
// reconfiguration frontier and switch points across copies
// (fsm UpdateTaskStatesRequest.KeepReconfig): only once every coordinator
// applies them alike (fsm KeepReconfigProtocol).
func (s *Server) keepReconfig() bool {
	return s.checkProtocol(fsm.KeepReconfigProtocol, "keeping reconfiguration frontiers") == nil
}

// NoteReconfigAcks takes a worker's reconfiguration acknowledgements
// into the leader's record (acksReceived) ahead of the report that writes
// them: the worker sends it when its tasks acknowledged a plan while its
// report loop waited for an earlier report's Raft write (the periodic
// one, every 250 ms: about one plan in ten waited for it, a write's time).
// Nothing is written: the report that follows records the
// acknowledgements in Raft, and the plan advances only from there. An
// acknowledgement counts only from the copy the leader's state places
// the task on (ackSeen), as in a report.
func (ws *workerService) NoteReconfigAcks(ctx context.Context, req *pb.ReportTasksRequest) (*pb.ReportTasksResponse, error) {
	s := ws.s
	resp := &pb.ReportTasksResponse{}
	if handled, err := s.leaderOrForward(ctx, workerMethod+"NoteReconfigAcks", req, resp); handled {
		return resp, err
	}
	if err := s.checkWorker(req.WorkerId, "note acknowledgements"); err != nil {
		return nil, err
	}
	// Hosted copies of partners' tasks are no task of this org's state
	// (their acknowledgements reach the owner with the reports).
	hosted := s.hostedOn(req.WorkerId)
	own := slices.DeleteFunc(slices.Clone(req.Tasks), func(t *pb.TaskState) bool { return hosted[t.TaskId] != nil })
	// Whether a report would be held (writeReport) does not matter:
	// nothing is written here.
	s.noteAcksReceived(req.WorkerId, own)
	return resp, nil
}

// WatchAssignments is a read: any coordinator serves it from its own state,
// blocking until the worker's assignment index passes min_index.
func (ws *workerService) WatchAssignments(ctx context.Context, req *pb.WatchAssignmentsRequest) (*pb.WatchAssignmentsResponse, error) {
	s := ws.s
	wait := time.Duration(req.MaxWaitMs) * time.Millisecond
	if wait <= 0 || wait > s.cfg.Timings.MaxWatchWait {
		wait = s.cfg.Timings.MaxWatchWait
	}
	// A follower may not have applied the worker's registration yet: give
	// it a moment before telling the worker it is unknown.
	if err := ws.waitForWorker(ctx, req.WorkerId); err != nil {
		return nil, err
	}
	var (
		tasks   []*fsm.Task
		queries []*fsm.QueryView
		woke    time.Time
	)
	index, err := s.State().BlockingQuery(ctx, req.MinIndex, wait, func(wset memdb.WatchSet) (uint64, error) {
		woke = time.Now()
		idx, t, q, err := s.State().WorkerAssignments(wset, req.WorkerId)
		tasks, queries = t, q
		return idx, err
	})
	if errors.Is(err, fsm.ErrWorkerNotFound) {
		return nil, errUnknownWorker(req.WorkerId)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Errorf(codes.Internal, "watch assignments: %v", err)
	}
	resp := &pb.WatchAssignmentsResponse{Index: index}
	queryIndex := map[string]uint64{}
	own := map[string]map[string]bool{} // query -> fragments this worker runs
	for _, t := range tasks {
		if own[t.Query] == nil {
			own[t.Query] = map[string]bool{}
		}
		own[t.Query][t.Fragment] = true
	}
	slotMaps := map[[2]string]*fsm.SlotMap{} // (query, fragment) -> current map
	var have map[uint64]bool                 // plans the worker holds (by digest)
	if len(req.ReconfigPlansHave) > 0 {
		have = make(map[uint64]bool, len(req.ReconfigPlansHave))
		for _, d := range req.ReconfigPlansHave {
			have[d] = true
		}
	}
	for _, q := range queries {
		view := &pb.QueryView{Name: q.Query.Name, Index: q.Query.CreateIndex, SpecJson: q.Query.SpecJSON, PaceOriginUnixNano: q.Query.PaceOrigin}
		if err := s.rcWire.fill(view, q.Query, req.ReconfigPlans, have); err != nil {
			return nil, status.Errorf(codes.Internal, "encode reconfiguration of %q: %v", q.Query.Name, err)
		}
		queryIndex[q.Query.Name] = q.Query.CreateIndex
		for _, m := range q.SlotMaps {
			if m.QueryIndex != q.Query.CreateIndex {
				continue // left from an older definition
			}
			slotMaps[[2]string{m.Query, m.Fragment}] = m
			pm := &pb.SlotMap{Fragment: m.Fragment, Epoch: m.Epoch,
				Partitions: int32(m.Partitions), Ranges: slotRangesPB(m.Ranges), Starts: m.Starts}
			if n := m.Next; n != nil {
				pm.NextEpoch, pm.NextPartitions, pm.NextRanges, pm.NextGo, pm.Cut = n.Epoch, int32(n.Partitions), slotRangesPB(n.Ranges), n.Go, n.Cut
			}
			view.SlotMaps = append(view.SlotMaps, pm)
		}
		needed := s.plans.neededFragments(q.Query, own[q.Query.Name])
		for _, t := range q.Tasks {
			if needed != nil && !needed[t.Fragment] {
				continue
			}
			at, gen := consumerPlacement(t)
			view.Tasks = append(view.Tasks, &pb.TaskPlacement{
				TaskId: t.ID, Fragment: t.Fragment, Partition: int32(t.Partition), Replica: int32(t.Replica),
				WorkerId: at, WorkerAddr: q.WorkerAddrs[at], Generation: int32(gen),
			})
		}
		resp.Queries = append(resp.Queries, view)
	}
	views := map[string]*fsm.QueryView{}
	for _, q := range queries {
		views[q.Query.Name] = q
	}
	ready := func(id string) bool {
		w, err := s.State().Worker(nil, id)
		return err == nil && w != nil && w.Status == fsm.WorkerStatusReady
	}
	for _, t := range tasks {
		if h := s.cfg.hooks.withhold; h != nil && h(req.WorkerId, t.ID, t.Gen()) {
			continue
		}
		a := &pb.Assignment{
			TaskId: t.ID, Query: t.Query, Fragment: t.Fragment,
			Partition: int32(t.Partition), Replica: int32(t.Replica), QueryIndex: queryIndex[t.Query],
			Generation: int32(t.Gen()), MovingOut: t.IsMovingOut(),
		}
		if q := views[t.Query]; q != nil {
			a.Bootstrap = bootstrapSource(t, q.Tasks, q.WorkerAddrs, ready)
			if a.Bootstrap != nil && t.MovingFrom != "" && isIngestSource(&s.plans, q.Query, t.Fragment) {
				a.Bootstrap.Halt = true // see isIngestSource
			}
			if a.Bootstrap != nil && t.MovingFrom != "" {
				// A hand-over from a worker declared down: the old copy may
				// be gone (see pb.SnapshotSource.source_down).
				w, err := s.State().Worker(nil, t.MovingFrom)
				a.Bootstrap.SourceDown = err == nil && w != nil && w.Status == fsm.WorkerStatusDown
			}
		}
		if q := views[t.Query]; q != nil && q.Query.Reconfig != nil {
			if plan := s.plans.plan(q.Query); plan != nil {
				a.MarkersExpected = int32(markersExpected(plan, t.Fragment, q.SlotMaps))
			}
			if k := t.ReconfigKept; k != nil {
				a.ReconfigKeptFrontier = k.Frontier
				for _, sw := range k.Switches {
					a.ReconfigKeptSwitches = append(a.ReconfigKeptSwitches, &pb.ReconfigSwitch{Epoch: sw.Epoch, At: sw.At})
				}
			}
		}
		if m := slotMaps[[2]string{t.Query, t.Fragment}]; m != nil {
			a.SlotEpoch = m.Epoch
			a.Slots = slotRangesPB(m.SlotsOf(t.Partition))
		}
		resp.Assignments = append(resp.Assignments, a)
	}
	s.hostedAssignments(req.WorkerId, resp)
	built := time.Now()
	for _, q := range queries {
		if e := q.Query.Reconfig.Latest(); e > 0 {
			s.acks.noteServed(req.WorkerId, q.Query.Name, e, woke, built)
		}
	}
	if h := s.cfg.hooks.watchServed; h != nil {
		h(req.WorkerId, index, woke, built)
	}
	return resp, nil
}

func slotRangesPB(ranges []fsm.SlotRange) []*pb.SlotRange {
	out := make([]*pb.SlotRange, len(ranges))
	for i, r := range ranges {
		out[i] = &pb.SlotRange{First: uint32(r.First), Last: uint32(r.Last), Partition: int32(r.Partition)}
	}
	return out
}

func (ws *workerService) waitForWorker(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st := ws.s.State()
	for {
		wset := memdb.NewWatchSet()
		w, err := st.Worker(wset, id)
		if err != nil {
			return status.Errorf(codes.Internal, "watch assignments: %v", err)
		}
		if w != nil {
			return nil
		}
		// Fires when the workers table changes (or the store is restored).
		if err := wset.WatchCtx(ctx); err != nil {
			return errUnknownWorker(id)
		}
	}
}

// planCache keeps the parsed plan of each query definition, so that a
// thousand workers waking on one change do not each re-parse its spec.
type planCache struct {
	mu    sync.Mutex
	plans map[string]*queryspec.Plan // name@create-index -> plan
}

// neededFragments is the set of fragments whose placements a worker running
// the given fragments needs: its own and their upstreams. Placements of the
// rest of the query would only make every watch response O(query size).
// nil means "all" (the spec could not be planned; send everything).
func (pc *planCache) neededFragments(q *fsm.Query, own map[string]bool) map[string]bool {
	plan := pc.plan(q)
	if plan == nil {
		return nil
	}
	needed := map[string]bool{}
	for f := range own {
		needed[f] = true
		if n := plan.Node(f); n != nil {
			for _, in := range n.Inputs {
				needed[in] = true
			}
		}
	}
	return needed
}

// plan returns the fused plan of a query definition, nil if its spec
// cannot be planned.
func (pc *planCache) plan(q *fsm.Query) *queryspec.Plan {
	key := fmt.Sprintf("%s@%d", q.Name, q.CreateIndex)
	pc.mu.Lock()
	plan, ok := pc.plans[key]
	pc.mu.Unlock()
	if !ok {
		spec, err := queryspec.FromJSON(q.SpecJSON)
		if err == nil {
			plan, err = spec.FusedPlan()
		}
		if err != nil {
			return nil
		}
		pc.mu.Lock()
		if pc.plans == nil || len(pc.plans) > 1024 {
			pc.plans = map[string]*queryspec.Plan{}
		}
		pc.plans[key] = plan
		pc.mu.Unlock()
	}
	return plan
}
