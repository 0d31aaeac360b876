package coordinator

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Live rescaling (issue 9 item 4).
//
// ScaleQuery changes the number of partitions of a keyed fragment while
// the query runs, in three plans through the plan applier (see
// fsm.SlotMapNext and worker/runtime/rescale.go):
//
//  1. prepare: the new slot map becomes the map's Next, and the tasks of
//     added partitions are created and placed (the applier re-checks
//     their placement as any other). Every task that routes to the
//     fragment, runs it or reads it holds where it is and reports its
//     frontier.
//  2. go: once every one of them has reported, the cut is set just above
//     the highest frontier: no task has produced or released anything at
//     or above it, so all of them switch at the same point of the stream.
//  3. finish: once every task of the fragment has passed the cut (handed
//     over and installed its slots) and every downstream task has
//     received the removed partitions' streams up to it, the new map
//     replaces the old one, its epoch one more, and the tasks of removed
//     partitions are deleted.
//
// A prepare that does not complete in time is aborted; after go the
// rescale only goes forward.

// MaxParallelism bounds the partitions a rescale may give a fragment.
const MaxParallelism = 256

// rescaleTimeout bounds the wait for every task to hold (prepare). The
// wait for every task to pass the cut is bounded by progress, not time
// (rescaleStall, rescale_resume.go).
const rescaleTimeout = 2 * time.Minute

// ScaleQuery implements AdminService.ScaleQuery.
func (as *adminService) ScaleQuery(ctx context.Context, req *pb.ScaleQueryRequest) (*pb.ScaleQueryResponse, error) {
	s := as.s
	if req.Query == "" || req.Operator == "" {
		return nil, status.Error(codes.InvalidArgument, "scale: a query name and an operator are required")
	}
	if req.Parallelism < 1 || req.Parallelism > MaxParallelism {
		return nil, status.Errorf(codes.InvalidArgument, "scale: parallelism %d is out of range 1..%d", req.Parallelism, MaxParallelism)
	}
	resp := &pb.ScaleQueryResponse{}
	if handled, err := s.leaderOrForward(ctx, adminMethod+"ScaleQuery", req, resp); handled {
		return resp, err
	}
	// A task at a partner runs with the slot maps it moved with, and the
	// rescale's holds and cut do not reach it.
	if hs, err := s.State().HostedTasks(nil); err == nil {
		for _, h := range hs {
			if h.Owner == s.cfg.Org && h.Query == req.Query {
				return nil, status.Errorf(codes.FailedPrecondition, "scale: task %s of query %s runs at org %s: bring it home first (fedstream task return)", h.TaskID, req.Query, h.Host)
			}
		}
	}
	s.scaleMu.Lock()
	defer s.scaleMu.Unlock()
	return s.rescale(ctx, req.Query, req.Operator, int(req.Parallelism))
}

// rescaleTarget is what a rescale works on.
type rescaleTarget struct {
	q        *fsm.Query
	frag     string
	cur      *fsm.SlotMap
	replicas int
	// involved are the fragments whose tasks take part: upstreams, the
	// fragment, downstreams; downstream the last.
	involved, downstream map[string]bool
	// source: frag is a generator source (srcscale.go).
	source bool
}

func (s *Server) rescaleTarget(name, op string) (*rescaleTarget, error) {
	st := s.State()
	q, err := st.Query(nil, name)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "scale: %v", err)
	}
	if q == nil || q.Status != fsm.QueryStatusRunning {
		return nil, status.Errorf(codes.NotFound, "scale: no running query %q", name)
	}
	plan := s.plans.plan(q)
	if plan == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "scale: the definition of query %s cannot be planned", name)
	}
	n := plan.Node(op)
	if n == nil {
		return nil, status.Errorf(codes.NotFound, "scale: query %s has no operator %q (operators fused into their upstream cannot be scaled on their own)", name, op)
	}
	if n.Kind == queryspec.KindSource {
		return s.sourceRescaleTarget(q, plan, n)
	}
	if n.Kind != queryspec.KindOperator || n.KeyFields == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "scale: %s of query %s is not a keyed operator (an aggregate with group_by or a join) or a generator source: only those rescale", op, name)
	}
	cur, err := st.SlotMap(nil, name, op)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "scale: %v", err)
	}
	if cur == nil || cur.QueryIndex != q.CreateIndex {
		return nil, status.Errorf(codes.Unavailable, "scale: the slot map of %s is not created yet; try again", op)
	}
	t := &rescaleTarget{q: q, frag: op, cur: cur, replicas: max(q.Replicas, 1), involved: map[string]bool{op: true}, downstream: map[string]bool{}}
	for _, in := range n.Inputs {
		up := plan.Node(in)
		if up != nil && up.Kind == queryspec.KindSource && up.Source != nil && up.Source.Gen == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "scale: %s reads source %s (ingest or kafka), which cannot hold its input at a cut: only operators fed by generators or other operators rescale", op, in)
		}
		t.involved[in] = true
	}
	for _, down := range n.Outputs {
		d := plan.Node(down)
		// Such a downstream is fed partition p by partition p (the
		// definitions' parallelism, which a rescale does not change).
		if d != nil && d.KeyFields == nil && d.Partitions > 1 && d.Partitions == n.Partitions {
			return nil, status.Errorf(codes.FailedPrecondition, "scale: downstream %s reads %s partition by partition (unkeyed, same parallelism): it cannot follow a rescale", down, op)
		}
		t.involved[down], t.downstream[down] = true, true
	}
	return t, nil
}

func (s *Server) rescale(ctx context.Context, name, op string, parallelism int) (*pb.ScaleQueryResponse, error) {
	return s.rescaleTo(ctx, name, op, parallelism, nil, 0)
}

// rescaleTo changes op's slot map to parallelism partitions owning ranges
// (nil: contiguous ranges, and nothing to do when the number of
// partitions stays). A rebalance keeps the partitions and gives ranges
// other owners: the same three phases move the slots and their state.
// expectEpoch, when not 0, is the epoch the caller planned from: a map
// changed since is refused as stale. The caller holds scaleMu.
func (s *Server) rescaleTo(ctx context.Context, name, op string, parallelism int, ranges []fsm.SlotRange, expectEpoch uint64) (*pb.ScaleQueryResponse, error) {
	if err := s.ensureSourceMap(ctx, name, op); err != nil {
		return nil, err
	}
	tg, err := s.rescaleTarget(name, op)
	if err != nil {
		return nil, err
	}
	if err := s.checkRescaleReaders(tg); err != nil {
		return nil, status.Error(codes.FailedPrecondition, "scale: "+err.Error())
	}
	cur := tg.cur
	if cur.Next != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "scale: a rescale of %s to epoch %d is already under way", op, cur.Next.Epoch)
	}
	if expectEpoch != 0 && cur.Epoch != expectEpoch {
		return nil, status.Errorf(codes.FailedPrecondition, "scale: stale: the slot map of %s is at epoch %d, planned from epoch %d", op, cur.Epoch, expectEpoch)
	}
	if ranges == nil {
		if parallelism == cur.Partitions {
			return mapResponse(cur, 0), nil
		}
		ranges = fsm.ContiguousSlotMap(parallelism)
	} else if parallelism == cur.Partitions && slices.Equal(ranges, cur.Ranges) {
		return mapResponse(cur, 0), nil
	}
	if why := fsm.CheckSlotRanges(ranges, parallelism); why != "" {
		return nil, status.Errorf(codes.InvalidArgument, "scale: %s", why)
	}
	epoch := cur.Epoch + 1
	update := func(phase string, cut int64) fsm.SlotMapUpdate {
		return fsm.SlotMapUpdate{Query: name, Fragment: op, QueryIndex: tg.q.CreateIndex, ExpectedEpoch: cur.Epoch,
			Partitions: parallelism, Ranges: ranges, Phase: phase, Cut: cut}
	}

	// Prepare: the new map as Next, the added partitions' tasks placed.
	st := s.State()
	workers, err := st.Workers(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "scale: %v", err)
	}
	tasks, err := st.Tasks(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "scale: %v", err)
	}
	placer := newPlacer(workers, tasks)
	placer.reserve(s.hostedLoad())
	prepare := fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, StateIndex: st.LatestIndex(), SlotMaps: []fsm.SlotMapUpdate{update(fsm.RescalePrepare, 0)}}
	var created []string
	for p := cur.Partitions; p < parallelism; p++ {
		for r := range tg.replicas {
			nt := fsm.PlannedTask{Query: name, Fragment: op, Partition: p, Replica: r, ScaleEpoch: epoch}
			t := &fsm.Task{ID: fsm.TaskID(name, op, p, r), Query: name, Fragment: op, Partition: p, Replica: r}
			to, why := placer.pick(t)
			if to == "" {
				return nil, status.Errorf(codes.FailedPrecondition, "scale: partition %d replica %d cannot be placed: %s", p, r, why)
			}
			prepare.NewTasks = append(prepare.NewTasks, nt)
			prepare.Placements = append(prepare.Placements, fsm.PlannedPlacement{TaskID: t.ID, FromGeneration: int(epoch), ToWorker: to})
			created = append(created, t.ID)
		}
	}
	abort := func(why string) { s.abortRescale(ctx, tg, epoch, created, why) }
	out, err := s.submitPlan(ctx, prepare)
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			return nil, err
		}
		return nil, status.Errorf(codes.Unavailable, "scale: %v", err)
	}
	if len(out.Result.Refused) > 0 {
		abort("prepare refused: " + out.Result.RefusedText())
		return nil, status.Errorf(codes.FailedPrecondition, "scale %s/%s refused: %s", name, op, out.Result.RefusedText())
	}
	s.logger.Info("rescale prepared", "query", name, "fragment", op, "epoch", epoch, "partitions", parallelism, "created", len(created))

	// Go: every involved task holds; the cut is above all of them.
	wctx, cancel := context.WithTimeout(ctx, rescaleTimeout)
	defer cancel()
	var cut int64 = math.MinInt64
	ended := ""
	err = s.waitTasks(wctx, name, func(t *fsm.Task) bool { return tg.involved[t.Fragment] }, func(t *fsm.Task) (bool, string) {
		if t.WorkerID == "" || t.Prepared < epoch {
			return false, fmt.Sprintf("%s has not reported holding for epoch %d", t.ID, epoch)
		}
		cut = max(cut, t.Frontier)
		// An operator that released its final boundary reports
		// MaxInt64, a generator that ended MaxInt64-1 (runtime hold):
		// either way nothing of its stream is left above a cut.
		if t.Frontier >= math.MaxInt64-1 && ended == "" {
			ended = t.ID
		}
		return true, ""
	}, func() { cut, ended = math.MinInt64, "" })
	if err != nil {
		abort(err.Error())
		return nil, status.Errorf(codes.DeadlineExceeded, "scale %s/%s: aborted: %v", name, op, err)
	}
	if ended != "" {
		// A task that released the end of its stream has no point below
		// which it could stop and hand slots over: the cut would be the
		// end of the stream, which the others never release "below".
		abort(ended + " released the end of its stream")
		return nil, status.Errorf(codes.FailedPrecondition, "scale %s/%s: %s has released the end of its stream (a finite source ended): nothing is left to rescale", name, op, ended)
	}
	if cut < math.MaxInt64-1 {
		cut++
	}
	if out, err = s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, StateIndex: s.State().LatestIndex(),
		SlotMaps: []fsm.SlotMapUpdate{update(fsm.RescaleGo, cut)}}); err != nil || len(out.Result.Refused) > 0 {
		why := ""
		if err != nil {
			why = err.Error()
		} else {
			why = out.Result.RefusedText()
		}
		abort("go not committed: " + why)
		return nil, status.Errorf(codes.Unavailable, "scale %s/%s: aborted: %s", name, op, why)
	}
	s.logger.Info("rescale cut set", "query", name, "fragment", op, "epoch", epoch, "cut", cut)

	// Finish: every task of the fragment passed the cut. From here the
	// rescale only goes forward, also when the caller has gone.
	m, err := s.finishRescale(ctx, tg, epoch, parallelism)
	if err != nil {
		return nil, err
	}
	return mapResponse(m, cut), nil
}

// abortRescale drops a prepared rescale of tg's fragment to epoch and
// deletes the tasks created for it.
func (s *Server) abortRescale(ctx context.Context, tg *rescaleTarget, epoch uint64, created []string, why string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	cur := tg.cur
	plan := fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, StateIndex: s.State().LatestIndex(), RemoveTasks: created,
		SlotMaps: []fsm.SlotMapUpdate{{Query: cur.Query, Fragment: cur.Fragment, QueryIndex: cur.QueryIndex, ExpectedEpoch: cur.Epoch,
			Partitions: cur.Partitions, Ranges: cur.Ranges, Phase: fsm.RescaleAbort}}}
	if _, err := s.submitPlan(actx, plan); err != nil {
		s.logger.Error("rescale abort failed", "query", cur.Query, "fragment", cur.Fragment, "epoch", epoch, "err", err)
		return
	}
	s.logger.Warn("rescale aborted", "query", cur.Query, "fragment", cur.Fragment, "epoch", epoch, "why", why)
}

// finishRescale waits until every task of tg's fragment passed the cut of
// the rescale to epoch and every downstream task received the removed
// partitions' streams up to it, then installs the new map and deletes the
// removed partitions' tasks.
//
// It goes on when ctx ends (the caller has gone: a rescale past its go
// only goes forward) for as long as it makes progress (waitProgress), but
// not past the server's shutdown or this node's leadership: the resumer
// finishes it (resumeRescalesLoop), and a shutdown must not wait for
// tasks that may never report again.
func (s *Server) finishRescale(ctx context.Context, tg *rescaleTarget, epoch uint64, parallelism int) (*fsm.SlotMap, error) {
	name, op, cur := tg.q.Name, tg.frag, tg.cur
	fctx, fcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer fcancel()
	defer context.AfterFunc(s.ctx, fcancel)()
	err := s.waitProgress(fctx, name, func(t *fsm.Task) bool { return t.Fragment == op || tg.downstream[t.Fragment] }, func(t *fsm.Task) (bool, string) {
		if t.CutDone < epoch {
			return false, fmt.Sprintf("%s has not reported passing the cut of epoch %d", t.ID, epoch)
		}
		return true, ""
	}, s.rescaleStallTime(), s.workedSince(func(id string) bool { return strings.HasPrefix(id, name+"/"+op+"/") }))
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "scale %s/%s: the rescale to epoch %d passed its go but did not finish: %v", name, op, epoch, err)
	}
	var removed []string
	for p := parallelism; p < cur.Partitions; p++ {
		for r := range tg.replicas {
			removed = append(removed, fsm.TaskID(name, op, p, r))
		}
	}
	finish := fsm.SlotMapUpdate{Query: name, Fragment: op, QueryIndex: tg.q.CreateIndex, ExpectedEpoch: cur.Epoch,
		Partitions: parallelism, Ranges: fsm.ContiguousSlotMap(parallelism), Phase: fsm.RescaleFinish}
	// The map being finished is the one prepared (tg.cur may have been
	// read before the prepare: a rebalance's ranges are not contiguous).
	if m, err := s.State().SlotMap(nil, name, op); err == nil && m != nil && m.Next != nil && m.Next.Epoch == epoch {
		finish.Ranges = m.Next.Ranges
	} else if cur.Next != nil {
		finish.Ranges = cur.Next.Ranges
	}
	finish.Starts = s.sourceStarts(tg, epoch)
	pctx, pcancel := context.WithTimeout(fctx, 30*time.Second)
	defer pcancel()
	out, err := s.submitPlan(pctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, StateIndex: s.State().LatestIndex(),
		SlotMaps: []fsm.SlotMapUpdate{finish}, RemoveTasks: removed})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "scale %s/%s: finish: %v", name, op, err)
	}
	if len(out.Result.Refused) > 0 {
		return nil, status.Errorf(codes.Internal, "scale %s/%s: finish refused: %s", name, op, out.Result.RefusedText())
	}
	m, err := s.State().SlotMap(nil, name, op)
	if err != nil || m == nil {
		return nil, status.Errorf(codes.Internal, "scale %s/%s: read the new map: %v", name, op, err)
	}
	s.logger.Info("rescale finished", "query", name, "fragment", op, "epoch", m.Epoch, "partitions", m.Partitions)
	return m, nil
}

// resumeRescales takes over the rescales left under way (a previous
// leader's, or one of this leader's whose finish stalled): one still
// being prepared is aborted (its holds lift, its created tasks go), one
// past its go is finished. A rescale this node is carrying out (scaleMu
// held) is left to it. b (nil: try every one) spaces the attempts on a
// rescale whose finish keeps failing.
func (s *Server) resumeRescales(ctx context.Context, b *resumeBackoff) {
	maps, err := s.State().SlotMaps(nil, "")
	if err != nil {
		s.logger.Error("cannot list slot maps to resume rescales", "err", err)
		return
	}
	live := map[string]bool{}
	for _, m := range maps {
		if m.Next != nil {
			live[resumeKey(m)] = true
		}
	}
	b.keep(live)
	for _, m := range maps {
		if m.Next == nil || !b.due(m, time.Now()) {
			continue
		}
		if !s.scaleMu.TryLock() {
			return // a rescale runs on this node: the next round looks again
		}
		tg, err := s.rescaleTarget(m.Query, m.Fragment)
		if err != nil || tg.cur.Next == nil {
			s.scaleMu.Unlock()
			continue
		}
		next := tg.cur.Next
		if !next.Go {
			var created []string
			tasks, _ := s.State().TasksByQuery(nil, m.Query)
			for _, t := range tasks {
				if t.Fragment == m.Fragment && t.ScaleEpoch == next.Epoch {
					created = append(created, t.ID)
				}
			}
			s.abortRescale(ctx, tg, next.Epoch, created, "left prepared with no rescale running")
		} else if _, err := s.finishRescale(ctx, tg, next.Epoch, next.Partitions); err != nil {
			retry := b.failed(m, time.Now())
			s.logger.Error("cannot finish a rescale left under way", "query", m.Query, "fragment", m.Fragment, "epoch", next.Epoch, "err", err, "retry_in", retry)
		}
		s.scaleMu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

// waitTasks blocks until ok holds for every task of query that match
// selects, re-checking on every state change; reset runs before each
// round. The error says which task it still waits for.
func (s *Server) waitTasks(ctx context.Context, query string, match func(*fsm.Task) bool, ok func(*fsm.Task) (bool, string), reset func()) error {
	st := s.State()
	for {
		ws := memdb.NewWatchSet()
		tasks, err := st.TasksByQuery(ws, query)
		if err != nil {
			return err
		}
		if reset != nil {
			reset()
		}
		sort.Slice(tasks, func(i, j int) bool { return tasks[i].ID < tasks[j].ID })
		waiting := ""
		for _, t := range tasks {
			if !match(t) {
				continue
			}
			if done, why := ok(t); !done {
				waiting = why
				break
			}
		}
		if waiting == "" {
			return nil
		}
		if err := ws.WatchCtx(ctx); err != nil {
			return fmt.Errorf("%s: %w", waiting, err)
		}
	}
}

func mapResponse(m *fsm.SlotMap, cut int64) *pb.ScaleQueryResponse {
	return &pb.ScaleQueryResponse{Query: m.Query, Fragment: m.Fragment, Epoch: m.Epoch, Partitions: int32(m.Partitions),
		Ranges: slotRangesPB(slices.Clone(m.Ranges)), Cut: cut}
}
