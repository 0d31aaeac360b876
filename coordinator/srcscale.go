package coordinator

import (
	"context"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
)

// Live rescaling of a generator source (issue 14: scale sources up to
// meet a throughput SLO). It is the rescale of rescale.go with the source
// fragment in the keyed fragment's place: the source's slot map counts
// its partitions (its slots mean nothing, nobody routes to a source) and
// carries the epoch, the phases and the cut; the tasks taking part are
// the source's and those of its downstream fragments. At the cut T a
// removed partition ends its stream below T, an added one starts its
// deterministic stream at T, and every reader adds or ends the inputs
// (worker/runtime/srcscale.go). The finish records where each added
// partition's stream starts (SlotMap.Starts, protocol 9), so a copy
// restarted later starts there too.

// sourceScaleProtocol is the replication protocol a source rescale needs:
// an older coordinator would ignore the starts its finish records.
const sourceScaleProtocol = 9

// isGeneratorSource reports whether n is a source whose partitions a live
// rescale can add and remove: a generator's (deterministic per seed and
// partition). An ingest or kafka partition is an external stream.
func isGeneratorSource(n *queryspec.Node) bool {
	return n != nil && n.Kind == queryspec.KindSource && n.Source != nil && n.Source.Gen != nil
}

// rescalable reports whether n may have a slot map: a keyed operator, or
// a generator source (its partitions).
func rescalable(n *queryspec.Node) bool {
	return n != nil && (n.KeyFields != nil || isGeneratorSource(n))
}

// sourceRescaleTarget is rescaleTarget for a source node n of query q.
func (s *Server) sourceRescaleTarget(q *fsm.Query, plan *queryspec.Plan, n *queryspec.Node) (*rescaleTarget, error) {
	name, op := q.Name, n.Name
	if !isGeneratorSource(n) {
		return nil, status.Errorf(codes.FailedPrecondition, "scale: source %s of query %s is an ingest or kafka source: its partitions are streams its producers (clients, Kafka partitions) feed, which a rescale cannot add or end at a cut; only generator sources rescale", op, name)
	}
	cur, err := s.State().SlotMap(nil, name, op)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "scale: %v", err)
	}
	if cur == nil || cur.QueryIndex != q.CreateIndex {
		return nil, status.Errorf(codes.Unavailable, "scale: the partition map of source %s is not created yet; try again", op)
	}
	if why := sourceScaleRefusal(plan, n, cur.Partitions); why != "" {
		return nil, status.Error(codes.FailedPrecondition, "scale: "+why)
	}
	t := &rescaleTarget{q: q, frag: op, cur: cur, replicas: max(q.Replicas, 1), involved: map[string]bool{op: true}, downstream: map[string]bool{}, source: true}
	for _, down := range n.Outputs {
		if plan.Node(down) != nil {
			t.involved[down], t.downstream[down] = true, true
		}
	}
	return t, nil
}

// sourceScaleRefusal says why the generator source n, running partitions
// partitions, cannot be rescaled because of what reads it ("" if it can).
func sourceScaleRefusal(plan *queryspec.Plan, n *queryspec.Node, partitions int) string {
	for _, down := range n.Outputs {
		d := plan.Node(down)
		if d == nil {
			continue
		}
		// Partition p of the source feeds partition p of such a
		// downstream (the definitions' parallelism): a partition added
		// would have no reader.
		if d.KeyFields == nil && d.Partitions > 1 && d.Partitions == n.Partitions {
			return fmt.Sprintf("downstream %s reads source %s partition by partition (unkeyed, same parallelism): it cannot follow a rescale of the source", down, n.Name)
		}
		// A sink with one input stream passes it through as its result
		// stream (same tuples, same ids): it cannot take a second one.
		if d.Kind == queryspec.KindSink && len(d.Inputs) == 1 && partitions == 1 {
			return fmt.Sprintf("sink %s reads the single stream of source %s and passes it through as its result stream: it cannot take more; put an operator between them", down, n.Name)
		}
	}
	return ""
}

// ensureSourceMap creates the partition map of a generator source op of
// query name before its first rescale (a keyed fragment has its map from
// the start; a source gets one only when it is rescaled), and checks that
// every coordinator speaks the protocol a source rescale needs. It does
// nothing for another fragment.
func (s *Server) ensureSourceMap(ctx context.Context, name, op string) error {
	q, err := s.State().Query(nil, name)
	if err != nil || q == nil || q.Status != fsm.QueryStatusRunning {
		return nil // rescaleTarget says what is wrong
	}
	plan := s.plans.plan(q)
	if plan == nil {
		return nil
	}
	n := plan.Node(op)
	if !isGeneratorSource(n) {
		return nil
	}
	if err := s.checkProtocol(sourceScaleProtocol, "a live rescale of a source"); err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	if m, err := s.State().SlotMap(nil, name, op); err != nil {
		return status.Errorf(codes.Internal, "scale: %v", err)
	} else if m != nil && m.QueryIndex == q.CreateIndex {
		return nil
	}
	parts := max(n.Partitions, 1)
	out, err := s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, StateIndex: s.State().LatestIndex(),
		SlotMaps: []fsm.SlotMapUpdate{{Query: name, Fragment: op, QueryIndex: q.CreateIndex, Partitions: parts, Ranges: fsm.ContiguousSlotMap(parts)}}})
	if err != nil {
		return status.Errorf(codes.Unavailable, "scale: create the partition map of source %s: %v", op, err)
	}
	if len(out.Result.Refused) > 0 {
		return status.Errorf(codes.FailedPrecondition, "scale: create the partition map of source %s: %s", op, out.Result.RefusedText())
	}
	return nil
}

// sourceStarts returns, for the finish of a rescale of a generator source
// to epoch, the stream start of every partition of the new map: what the
// current map records for the partitions it keeps (math.MinInt64 for the
// whole stream), the rescale's cut for those it adds. nil when tg is not
// a source or the rescale is not past its go.
func (s *Server) sourceStarts(tg *rescaleTarget, epoch uint64) []int64 {
	if !tg.source {
		return nil
	}
	m, err := s.State().SlotMap(nil, tg.q.Name, tg.frag)
	if err != nil || m == nil || m.Next == nil || m.Next.Epoch != epoch || !m.Next.Go {
		return nil
	}
	starts := make([]int64, m.Next.Partitions)
	for p := range starts {
		switch {
		case p < len(m.Starts):
			starts[p] = m.Starts[p]
		case p < m.Partitions:
			starts[p] = math.MinInt64
		default:
			starts[p] = m.Next.Cut
		}
	}
	return starts
}
