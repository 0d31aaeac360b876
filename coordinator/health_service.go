package coordinator

import (
	"context"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// healthService serves the health manager's action log and blacklist.
// Both are read from this coordinator's replicated state: a follower
// answers too, as of the last entry it applied.
type healthService struct {
	pb.UnimplementedHealthServiceServer
	s *Server
}

func healthActionPB(a *fsm.HealthAction) *pb.HealthAction {
	return &pb.HealthAction{Id: a.ID, Query: a.Query, Fragment: a.Fragment, Diagnosis: a.Diagnosis, Action: a.Action,
		Symptoms: a.Symptoms, Detail: a.Detail, AtMs: a.AtMs, Metrics: a.Metrics, Outcome: a.Outcome, OutcomeDetail: a.OutcomeDetail,
		EvaluatedAtMs: a.EvaluatedAtMs, FromParallelism: int32(a.FromParallelism), ToParallelism: int32(a.ToParallelism)}
}

// Actions implements HealthService.Actions: the log in the order the
// actions were decided.
func (h *healthService) Actions(_ context.Context, req *pb.HealthActionsRequest) (*pb.HealthActionsResponse, error) {
	acts, err := h.s.State().HealthActions(nil, req.Query)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "health actions: %v", err)
	}
	sort.SliceStable(acts, func(i, j int) bool {
		if acts[i].AtMs != acts[j].AtMs {
			return acts[i].AtMs < acts[j].AtMs
		}
		return acts[i].CreateIndex < acts[j].CreateIndex
	})
	resp := &pb.HealthActionsResponse{}
	for _, a := range acts {
		resp.Actions = append(resp.Actions, healthActionPB(a))
	}
	return resp, nil
}

// Blacklist implements HealthService.Blacklist: every pair with an
// evaluated action, with the thresholds this coordinator applies.
func (h *healthService) Blacklist(_ context.Context, req *pb.HealthBlacklistRequest) (*pb.HealthBlacklistResponse, error) {
	acts, err := h.s.State().HealthActions(nil, req.Query)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "health blacklist: %v", err)
	}
	cfg := h.s.cfg.Health
	cfg.fill()
	resp := &pb.HealthBlacklistResponse{FailureRatio: cfg.FailureRatio, MinEvaluated: int32(cfg.MinEvaluated)}
	for p, r := range blacklistOf(h.s.State(), acts, cfg.FailureRatio, cfg.MinEvaluated) {
		// No proto change: the operator a pair is scoped to rides in the
		// query field as "query/operator" (names hold no '/'; task ids
		// join them so); a query-wide pair (older log entries) is the
		// query name alone.
		q := p.Query
		if p.Fragment != "" {
			q += "/" + p.Fragment
		}
		resp.Pairs = append(resp.Pairs, &pb.HealthPair{Query: q, Diagnosis: p.Diagnosis, Action: p.Action,
			Evaluated: int32(r.Evaluated), Failed: int32(r.Failed), Blacklisted: r.Blacklisted})
	}
	sort.Slice(resp.Pairs, func(i, j int) bool {
		a, b := resp.Pairs[i], resp.Pairs[j]
		if a.Query != b.Query {
			return a.Query < b.Query
		}
		if a.Diagnosis != b.Diagnosis {
			return a.Diagnosis < b.Diagnosis
		}
		return a.Action < b.Action
	})
	return resp, nil
}
