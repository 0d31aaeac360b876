package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Live reconfiguration (issue 13): ReconfigService.UpdateQuery validates
// the new definition of a running query against the configuration it runs
// now and commits one plan with a new version per changed operator; the
// plan then advances by itself as tasks report (fsm.QueryReconfig).
// QueryVersions shows each operator's versions and the plans' progress.

type reconfigService struct {
	pb.UnimplementedReconfigServiceServer
	s *Server
}

// UpdateQuery implements ReconfigService.UpdateQuery.
func (rs *reconfigService) UpdateQuery(ctx context.Context, req *pb.UpdateQueryRequest) (*pb.UpdateQueryResponse, error) {
	s := rs.s
	name := req.Filename
	if name == "" {
		name = "query"
	}
	next, err := queryspec.Parse(name, req.Yaml)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	strategy := req.Strategy
	switch strategy {
	case "":
		strategy = fsm.StrategyLive
	case fsm.StrategyLive, fsm.StrategyQuiescent:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "update: strategy %q is not %q or %q", req.Strategy, fsm.StrategyLive, fsm.StrategyQuiescent)
	}
	switch req.Tracking {
	case "", fsm.TrackingStatic, fsm.TrackingDynamic:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "update: tracking %q is not %q or %q", req.Tracking, fsm.TrackingStatic, fsm.TrackingDynamic)
	}
	if req.SwitchMarginMs < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update: negative switch margin %d ms", req.SwitchMarginMs)
	}
	resp := &pb.UpdateQueryResponse{}
	if handled, err := s.leaderOrForward(ctx, pb.ReconfigService_UpdateQuery_FullMethodName, req, resp); handled {
		return resp, err
	}
	q, err := s.State().Query(nil, next.Name)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read query: %v", err)
	}
	if q == nil || q.Status != fsm.QueryStatusRunning {
		return nil, status.Errorf(codes.NotFound, "update: query %q is not running (submit it first)", next.Name)
	}
	if err := s.checkPlanParticipants(q, strategy); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "update %s: %v", name, err)
	}
	curJSON := q.SpecJSON
	if rc := q.Reconfig; rc != nil && len(rc.Plans) > 0 {
		curJSON = rc.Plans[len(rc.Plans)-1].SpecJSON
	}
	cur, err := queryspec.FromJSON(curJSON)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "update: the running definition of %q: %v", q.Name, err)
	}
	changed, err := queryspec.ReconfigChanges(cur, next)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "update %s: %v", name, err)
	}
	spec, err := next.CanonicalJSON()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode query: %v", err)
	}
	epoch := q.Reconfig.Latest() + 1
	plan := fsm.ReconfigPlan{Epoch: epoch, Strategy: strategy, SpecJSON: spec, SwitchMargin: req.SwitchMarginMs * int64(time.Millisecond)}
	if strategy == fsm.StrategyQuiescent && plan.SwitchMargin == 0 {
		// The sources are held from when they learn the plan, so none
		// can pass a cut just above what they produced.
		plan.SwitchMargin = 1
	}
	for _, op := range changed {
		def, err := json.Marshal(next.OperatorByName(op))
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encode operator %q: %v", op, err)
		}
		v := q.Reconfig.VersionOf(op, epoch-1) + 1
		plan.Changes = append(plan.Changes, fsm.OperatorChange{Operator: op, Version: v, SpecJSON: def})
		resp.Changes = append(resp.Changes, &pb.OperatorVersionChange{Operator: op, Version: int32(v)})
	}
	res, err := s.apply(ctx, fsm.ReconfigureQueryType, fsm.ReconfigureQueryRequest{
		Query: q.Name, Plan: plan, Tracking: req.Tracking, IdempotencyKey: req.IdempotencyKey, At: time.Now().UnixNano(),
	})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if errors.Is(res.Err, fsm.ErrQueryNotFound) {
			return nil, status.Errorf(codes.NotFound, "update: %v", res.Err)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "update %s: %v", name, res.Err)
	}
	s.logger.Info("reconfiguration plan committed", "query", q.Name, "epoch", epoch, "operators", changed, "index", res.Index)
	resp.Name, resp.Epoch = q.Name, epoch
	return resp, nil
}

// QueryVersions implements ReconfigService.QueryVersions. It reads the
// local state (a follower may be a little behind).
func (rs *reconfigService) QueryVersions(ctx context.Context, req *pb.QueryVersionsRequest) (*pb.QueryVersionsResponse, error) {
	st := rs.s.State()
	q, err := st.Query(nil, req.Name)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read query: %v", err)
	}
	if q == nil {
		return nil, status.Errorf(codes.NotFound, "query %q not found", req.Name)
	}
	tasks, err := st.TasksByQuery(nil, q.Name)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read tasks: %v", err)
	}
	ready := map[string]bool{}
	// partnerOf: the partner org each worker record standing for one
	// stands for.
	partnerOf := map[string]string{}
	workers, err := st.Workers(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read workers: %v", err)
	}
	for _, w := range workers {
		ready[w.ID] = w.Status == fsm.WorkerStatusReady
		if isPartnerWorker(w) {
			partnerOf[w.ID] = w.Labels[partnerLabel]
		}
	}
	// Whether a copy runs at a partner only the leader knows (it syncs
	// with the partners, xorg_copies.go): a plan waiting for a task
	// placed there is answered by the leader.
	if !rs.s.IsLeader() && !isForwarded(ctx) && q.Reconfig.Completed() < q.Reconfig.Latest() {
		for _, t := range tasks {
			if partnerOf[t.WorkerID] == "" {
				continue
			}
			fwd := &pb.QueryVersionsResponse{}
			if handled, err := rs.s.leaderOrForward(ctx, pb.ReconfigService_QueryVersions_FullMethodName, req, fwd); handled && err == nil {
				return fwd, nil
			}
			break // no leader to ask: this node's view
		}
	}
	spec, err := queryspec.FromJSON(q.SpecJSON)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "query %q: %v", q.Name, err)
	}
	plan, err := spec.FusedPlan()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "query %q: %v", q.Name, err)
	}
	maps, err := st.SlotMaps(nil, q.Name)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read slot maps: %v", err)
	}
	rc := q.Reconfig
	resp := &pb.QueryVersionsResponse{Name: q.Name, Tracking: fsm.TrackingStatic}
	if rc != nil {
		resp.Tracking = rc.Tracking
	}
	// progress of one task for epoch e: acked, markers expected and seen.
	progress := func(t *fsm.Task, e uint64) (acked bool, expected, seen int) {
		expected = markersExpected(plan, t.Fragment, maps)
		switch {
		case t.ReconfigLevel >= e:
			seen = expected
		default:
			for _, m := range t.ReconfigMarkers {
				if m.Epoch == e {
					seen = m.Seen
				}
			}
		}
		return t.ReconfigAcked >= e, expected, seen
	}
	fragmentOf := map[string]string{}
	for _, n := range plan.Nodes {
		for _, m := range n.Members {
			fragmentOf[m] = n.Name
		}
	}
	for _, op := range spec.Operators {
		ov := &pb.OperatorVersions{Operator: op.Name}
		active := []int{1}
		if rc != nil {
			active = rc.ActiveVersions(op.Name)
		}
		intro := []struct {
			v int
			e uint64
		}{{1, 0}}
		if rc != nil {
			for _, p := range rc.Plans {
				for _, c := range p.Changes {
					if c.Operator == op.Name {
						intro = append(intro, struct {
							v int
							e uint64
						}{c.Version, p.Epoch})
					}
				}
			}
		}
		for _, in := range intro {
			vi := &pb.VersionInfo{Version: int32(in.v), Active: slices.Contains(active, in.v), Epoch: in.e}
			for _, t := range tasks {
				if t.Fragment != fragmentOf[op.Name] {
					continue
				}
				vi.Tasks++
				acked, exp, seen := progress(t, in.e)
				if acked || in.e == 0 {
					vi.TasksAcked++
				}
				if in.e > 0 {
					vi.MarkersExpected += int32(exp)
					vi.MarkersSeen += int32(seen)
				}
			}
			ov.Versions = append(ov.Versions, vi)
		}
		resp.Operators = append(resp.Operators, ov)
	}
	if rc != nil {
		for _, p := range rc.Plans {
			pi := &pb.ReconfigPlanInfo{Epoch: p.Epoch, Phase: p.Phase, Cut: p.Cut, Strategy: p.Strategy, Tasks: int32(len(tasks))}
			for _, c := range p.Changes {
				pi.Changes = append(pi.Changes, &pb.OperatorVersionChange{Operator: c.Operator, Version: int32(c.Version)})
			}
			for _, t := range tasks {
				acked, exp, seen := progress(t, p.Epoch)
				if acked {
					pi.TasksAcked++
				}
				pi.MarkersExpected += int32(exp)
				pi.MarkersSeen += int32(seen)
				if p.Phase != fsm.ReconfigComplete && (t.WorkerID == "" || !ready[t.WorkerID]) {
					where := "unplaced"
					if t.WorkerID != "" {
						where = "worker " + t.WorkerID + " not ready"
					}
					pi.Disconnected = append(pi.Disconnected, fmt.Sprintf("%s (%s)", t.ID, where))
				} else if org := partnerOf[t.WorkerID]; p.Phase != fsm.ReconfigComplete && org != "" {
					if why := rs.s.partnerCopyMissing(t, org); why != "" {
						pi.Disconnected = append(pi.Disconnected, fmt.Sprintf("%s (%s)", t.ID, why))
					}
				}
			}
			resp.Plans = append(resp.Plans, pi)
		}
	}
	return resp, nil
}

// markersExpected is how many reconfiguration markers a task of fragment
// gets per epoch: one from every upstream instance (partition) it reads.
func markersExpected(plan *queryspec.Plan, fragment string, maps []*fsm.SlotMap) int {
	n := plan.Node(fragment)
	if n == nil {
		return 0
	}
	total := 0
	for _, in := range n.Inputs {
		up := plan.Node(in)
		if up == nil {
			continue
		}
		parts := max(up.Partitions, 1)
		for _, m := range maps {
			if m.Fragment == in && m.Partitions > 0 {
				parts = m.Partitions
			}
		}
		total += parts
	}
	return total
}
