package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// adminService serves operators and client tools.
type adminService struct {
	pb.UnimplementedAdminServiceServer
	s *Server
}

const adminMethod = "/fedstream.v1.AdminService/"

func (as *adminService) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	s := as.s
	leaderAddr, leaderID := s.raft.LeaderWithID()
	resp := &pb.StatusResponse{
		Org: s.cfg.Org, NodeId: s.cfg.NodeID,
		LeaderId: string(leaderID), LeaderAddr: string(leaderAddr),
		LastIndex: s.raft.LastIndex(), AppliedIndex: s.raft.AppliedIndex(),
		State: s.raft.State().String(), GrpcAddr: s.GRPCAddr(), DevMode: s.DevMode(), InsecurePlaintext: s.cfg.InsecurePlaintext,
	}
	if leaderID != "" {
		if addrs := s.grpcAddrsOf(string(leaderID), string(leaderAddr)); len(addrs) > 0 {
			resp.LeaderGrpcAddr = addrs[0]
		}
	}
	if cf := s.raft.GetConfiguration(); cf.Error() == nil {
		for _, srv := range cf.Configuration().Servers {
			resp.Peers = append(resp.Peers, &pb.Peer{Id: string(srv.ID), Addr: string(srv.Address), Suffrage: srv.Suffrage.String()})
		}
	}
	return resp, nil
}

func (as *adminService) ListWorkers(ctx context.Context, _ *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	st := as.s.State()
	workers, err := st.Workers(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list workers: %v", err)
	}
	resp := &pb.ListWorkersResponse{}
	for _, w := range workers {
		tasks, err := st.TasksByWorker(nil, w.ID)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list tasks of worker %s: %v", w.ID, err)
		}
		info := &pb.WorkerInfo{Id: w.ID, Org: w.Org, Addr: w.Addr, Status: as.s.shownStatus(w), Cores: w.Cores, Labels: w.Labels, Name: w.Name, DataplaneLevel: w.DataPlaneLevel}
		if info.Status == statusReady {
			if silent, ok := as.s.silentWorker(w); ok {
				// The table still says ready until the TTL runs out;
				// showing ready for a killed or paused worker misleads.
				info.Status = states.WorkerUnreachable
				info.StatusNote = fmt.Sprintf("no heartbeat for %s; declared down and its tasks placed again after %s of silence",
					silent.Round(100*time.Millisecond), as.s.cfg.Timings.HeartbeatTTL)
			}
		}
		for _, t := range tasks {
			info.Tasks = append(info.Tasks, t.ID)
			info.TaskStates = append(info.TaskStates, &pb.TaskState{TaskId: t.ID, State: t.State, Message: t.Message, Generation: int32(t.Gen()),
				ReplicaState: pb.ReplicaState(pb.ReplicaState_value[t.ReplicaState]), Tentative: t.Tentative, Lossy: t.Lossy})
		}
		resp.Workers = append(resp.Workers, info)
	}
	return resp, nil
}

// planTasks expands a validated query into its tasks: one per fragment of
// the fused plan (what workers run), partition and replica.
func planTasks(q *queryspec.Query) ([]*fsm.Task, error) {
	plan, err := q.FusedPlan()
	if err != nil {
		return nil, err
	}
	replicas := max(q.Replicas, 1)
	var tasks []*fsm.Task
	for _, n := range plan.Nodes {
		for p := 0; p < max(n.Partitions, 1); p++ {
			for r := 0; r < replicas; r++ {
				tasks = append(tasks, &fsm.Task{
					ID:    queryspec.TaskID(q.Name, n.Name, p, r),
					Query: q.Name, Fragment: n.Name, Partition: p, Replica: r,
					State: states.TaskPending,
				})
			}
		}
	}
	return tasks, nil
}

func (as *adminService) SubmitQuery(ctx context.Context, req *pb.SubmitQueryRequest) (*pb.SubmitQueryResponse, error) {
	s := as.s
	name := req.Filename
	if name == "" {
		name = "query"
	}
	// Validate before forwarding: a follower can refuse bad input itself.
	q, err := queryspec.Parse(name, req.Yaml)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp := &pb.SubmitQueryResponse{}
	if handled, err := s.leaderOrForward(ctx, adminMethod+"SubmitQuery", req, resp); handled {
		return resp, err
	}
	spec, err := q.CanonicalJSON()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode query: %v", err)
	}
	tasks, err := planTasks(q)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	workers, err := s.State().Workers(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read workers: %v", err)
	}
	existing, err := s.State().Tasks(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read tasks: %v", err)
	}
	if err := s.checkLimits(q, len(tasks), workers, existing); err != nil {
		return nil, err
	}
	maxDelay := q.Availability.MaxDelay
	// The pacing origin travels in the command, so every coordinator
	// applies the same one.
	body := fsm.SubmitQueryRequest{
		Query: fsm.Query{Name: q.Name, SpecJSON: spec, Status: states.QueryRunning, Replicas: max(q.Replicas, 1), MaxDelay: maxDelay,
			PaceOrigin: time.Now().UnixNano()},
		IdempotencyKey: req.IdempotencyKey,
	}
	for _, t := range tasks {
		body.Tasks = append(body.Tasks, *t)
	}
	res, err := s.apply(ctx, fsm.SubmitQueryType, body)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if errors.Is(res.Err, fsm.ErrQueryExists) {
			return nil, status.Errorf(codes.AlreadyExists, "query %q is already running: stop it first (fedstream query stop %s)", q.Name, q.Name)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "submit %s: %v", name, res.Err)
	}
	s.logger.Info("query submitted", "query", q.Name, "tasks", len(tasks), "index", res.Index)
	// The tasks were created unplaced; they are placed by a plan like
	// every other placement. If that fails here the scheduler places
	// them on its next pass (the query exists either way).
	s.placeQuery(ctx, q.Name)
	return &pb.SubmitQueryResponse{Name: q.Name, Index: res.Index, Tasks: int32(len(tasks))}, nil
}

// placeQuery plans the placement of a query's unplaced tasks and submits
// it to the plan applier. Refusals are stored on the waiting tasks by the
// applier; failures are logged.
func (s *Server) placeQuery(ctx context.Context, name string) {
	at := s.State().LatestIndex()
	workers, err1 := s.State().Workers(nil)
	all, err2 := s.State().Tasks(nil)
	if err := errors.Join(err1, err2); err != nil {
		s.logger.Error("placing a submitted query: cannot read the state", "query", name, "err", err)
		return
	}
	var mine []fsm.PlannedPlacement
	for _, p := range replace(workers, all, s.hostedLoad(), s.handOverNow()) {
		if t, _ := s.State().Task(nil, p.TaskID); t != nil && t.Query == name {
			mine = append(mine, p)
		}
	}
	if len(mine) == 0 {
		return
	}
	s.placeAndLog(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceSubmit, StateIndex: at, Placements: mine})
}

// checkLimits refuses a query the org cannot run: more replicas than it
// has workers (replicas of a partition run on different workers), or more
// tasks than its task limits. Errors name the limit, its value, what the
// query needs and how to raise the limit.
func (s *Server) checkLimits(q *queryspec.Query, need int, workers []*fsm.Worker, existing []*fsm.Task) error {
	// Cores count for workers not down: right after an election every
	// worker is unknown until it heartbeats, and the limits must not
	// shrink to the floor meanwhile.
	ready, known, cores := 0, 0, 0
	for _, w := range workers {
		known++
		if w.Status == statusReady {
			ready++
		}
		if w.Status != statusDown {
			cores += max(int(w.Cores), 1)
		}
	}
	replicas := max(q.Replicas, 1)
	// An org with no worker at all yet accepts the query (its tasks wait,
	// pending, saying so); an org with workers, some down, accepts it if
	// enough of them may come back.
	if known > 0 && replicas > known {
		return status.Errorf(codes.FailedPrecondition,
			"replicas: %d but the org has %d ready workers (%d known); each replica of a partition runs on a different worker: lower replicas to at most %d or add workers",
			replicas, ready, known, max(ready, 1))
	}
	derived := derivedTaskLimit(cores)
	how := fmt.Sprintf("derived: %d cores of workers not down x %d tasks per core, at least %d", cores, tasksPerCore, minTaskLimit)
	perQuery, perQueryHow := s.cfg.Limits.MaxTasksPerQuery, "configured"
	if perQuery == 0 {
		perQuery, perQueryHow = derived, how
	}
	if need > perQuery {
		return status.Errorf(codes.ResourceExhausted,
			"query %s needs %d tasks (fragments x partitions x replicas) but max-tasks-per-query is %d (%s): lower parallelism or replicas, add workers, or raise max-tasks-per-query in the coordinators' configuration",
			q.Name, need, perQuery, perQueryHow)
	}
	perOrg, perOrgHow := s.cfg.Limits.MaxTasksPerOrg, "configured"
	if perOrg == 0 {
		perOrg, perOrgHow = derived, how
	}
	running := 0
	for _, t := range existing {
		if t.Query != q.Name { // a stopped query of that name is replaced
			running++
		}
	}
	if running+need > perOrg {
		return status.Errorf(codes.ResourceExhausted,
			"query %s needs %d tasks and the org runs %d already, but max-tasks-per-org is %d (%s): stop a query, lower parallelism or replicas, add workers, or raise max-tasks-per-org in the coordinators' configuration",
			q.Name, need, running, perOrg, perOrgHow)
	}
	return nil
}

func (as *adminService) queryInfo(q *fsm.Query) (*pb.QueryInfo, error) {
	st := as.s.State()
	tasks, err := st.TasksByQuery(nil, q.Name)
	if err != nil {
		return nil, err
	}
	maps, err := st.SlotMaps(nil, q.Name)
	if err != nil {
		return nil, err
	}
	slotMaps := map[string]*fsm.SlotMap{}
	plan := as.s.plans.plan(q)
	for _, m := range maps {
		if plan != nil && isGeneratorSource(plan.Node(m.Fragment)) {
			continue // a rescaled source's map counts partitions: no slots to show
		}
		if m.QueryIndex == q.CreateIndex {
			slotMaps[m.Fragment] = m
		}
	}
	info := &pb.QueryInfo{Name: q.Name, Status: q.Status, Index: q.CreateIndex, Replicas: int32(q.Replicas), MaxDelay: q.MaxDelay, SpecJson: q.SpecJSON}
	hostedList, err := st.HostedTasks(nil)
	if err != nil {
		return nil, err
	}
	atPartners := map[string]*fsm.HostedTask{} // this org's tasks at partners
	for _, h := range hostedList {
		if h.Owner == as.s.cfg.Org && h.Query == q.Name {
			atPartners[h.TaskID] = h
		}
	}
	for _, t := range tasks {
		ti := &pb.TaskInfo{TaskId: t.ID, Fragment: t.Fragment, Partition: int32(t.Partition), Replica: int32(t.Replica),
			WorkerId: t.WorkerID, State: t.State, Message: t.Message, Generation: int32(t.Gen()), MovingFrom: t.MovingFrom,
			ReplicaState: pb.ReplicaState(pb.ReplicaState_value[t.ReplicaState]), Tentative: t.Tentative, Lossy: t.Lossy}
		if m := slotMaps[t.Fragment]; m != nil {
			ti.SlotEpoch = m.Epoch
			for _, r := range m.SlotsOf(t.Partition) {
				ti.SlotCount += int32(r.Last - r.First + 1)
			}
		}
		if t.WorkerID != "" {
			w, err := st.Worker(nil, t.WorkerID)
			if err != nil {
				return nil, fmt.Errorf("read worker %s of task %s: %w", t.WorkerID, t.ID, err)
			}
			if w != nil {
				ti.WorkerAddr = w.Addr
				switch as.s.shownStatus(w) {
				case statusReady:
					if silent, ok := as.s.silentWorker(w); ok {
						// Killed, paused or cut off: its last report no
						// longer tells, though the TTL has not run out.
						ti.Message = fmt.Sprintf("worker %s unreachable: no heartbeat for %s (last reported: %s); declared down and its tasks placed again after %s of silence",
							w.ID, silent.Round(100*time.Millisecond), t.State, as.s.cfg.Timings.HeartbeatTTL)
						ti.State = states.TaskUnreachable
						break
					}
					switch {
					case t.MovingFrom != "" && t.Message == "":
						// A live move: the new copy starts or catches
						// up here while the old one still serves every
						// consumer; nothing has stopped.
						ti.Message = movingNote(t)
					case t.State == states.TaskPending && t.Message == "":
						ti.Message = fmt.Sprintf("placed on worker %s, which has not reported it running yet", w.ID)
					}
				case statusUnknown:
					// The leader has not heard from the worker since it
					// took office: the last report may no longer hold.
					ti.State = states.TaskUnknown
					ti.Message = fmt.Sprintf("worker %s not heard from since the current leader took office (last reported: %s)", w.ID, t.State)
				default:
					ti.State = states.TaskLost
				}
			}
		} else {
			ti.State = states.TaskPending
		}
		placedAt(ti, atPartners)
		if t.Lossy {
			ti.Message = joinNote(ti.Message, lossyNote(t, tasks, as.readyWorkers()))
		}
		info.Tasks = append(info.Tasks, ti)
	}
	return info, nil
}

// movingNote says, for query status, where a task in a live move stands:
// its old copy on t.MovingFrom serves every consumer until the new copy
// (t's placement) runs and has caught up, then consumers switch and the
// old copy stops.
func movingNote(t *fsm.Task) string {
	if t.State == states.TaskRunning {
		return fmt.Sprintf("moving from worker %s: this copy runs and catches up; the old copy serves until it has", t.MovingFrom)
	}
	return fmt.Sprintf("moving from worker %s: this copy starts from the old copy's snapshot; the old copy serves meanwhile", t.MovingFrom)
}

func (as *adminService) ListQueries(ctx context.Context, _ *pb.ListQueriesRequest) (*pb.ListQueriesResponse, error) {
	qs, err := as.s.State().Queries(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list queries: %v", err)
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i].Name < qs[j].Name })
	resp := &pb.ListQueriesResponse{}
	for _, q := range qs {
		info, err := as.queryInfo(q)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list queries: %v", err)
		}
		info.SpecJson = nil
		resp.Queries = append(resp.Queries, info)
	}
	return resp, nil
}

func (as *adminService) GetQuery(ctx context.Context, req *pb.GetQueryRequest) (*pb.QueryInfo, error) {
	q, err := as.s.State().Query(nil, req.Name)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "get query: %v", err)
	}
	if q == nil {
		return nil, status.Errorf(codes.NotFound, "no query named %q (fedstream query list shows the queries)", req.Name)
	}
	info, err := as.queryInfo(q)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "get query: %v", err)
	}
	return info, nil
}

func (as *adminService) StopQuery(ctx context.Context, req *pb.StopQueryRequest) (*pb.StopQueryResponse, error) {
	s := as.s
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "stop: query name is required")
	}
	resp := &pb.StopQueryResponse{}
	if handled, err := s.leaderOrForward(ctx, adminMethod+"StopQuery", req, resp); handled {
		return resp, err
	}
	res, err := s.apply(ctx, fsm.StopQueryType, fsm.StopQueryRequest{Name: req.Name, IdempotencyKey: req.IdempotencyKey})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if errors.Is(res.Err, fsm.ErrQueryNotFound) {
			return nil, status.Errorf(codes.NotFound, "no query named %q", req.Name)
		}
		return nil, status.Error(codes.FailedPrecondition, fmt.Sprintf("stop %s: %v", req.Name, res.Err))
	}
	return resp, nil
}
