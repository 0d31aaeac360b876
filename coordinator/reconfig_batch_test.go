package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestReconfigAcksOfTwoWorkersInOneEntry: the report of the first worker
// to acknowledge a plan is held until the other worker's report, which
// completes the plan's acknowledgements, arrives; both go into one Raft
// entry, which switches the plan. (Before, the first report was written
// alone and the plan switched one write later.) A report is not held
// while a task of its own worker has not acknowledged: that task's
// acknowledgement comes in the worker's next report, which waits for it.
func TestReconfigAcksOfTwoWorkersInOneEntry(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	// The test decides when the second report comes.
	ap := ackPlanSetUp(t, s, 5*time.Minute)
	ctx, must, report, src, src1, f := ap.ctx, ap.must, ap.report, ap.src, ap.src1, ap.f
	first := ap.reportHeld(t, s, "wa", src, src1)
	if err := report("wb", 1, f); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the held report never returned")
	}
	q, err := s.State().Query(nil, "q")
	if err != nil || q == nil || q.Reconfig == nil {
		t.Fatal(q, err)
	}
	p := q.Reconfig.Plans[0]
	ta, _ := s.State().Task(nil, src)
	tb, _ := s.State().Task(nil, f)
	if p.Phase != fsm.ReconfigSwitched || ta == nil || tb == nil || ta.ReconfigAcked != 1 || tb.ReconfigAcked != 1 ||
		ta.ModifyIndex != p.SwitchIndex || tb.ModifyIndex != p.SwitchIndex {
		t.Fatalf("plan %+v; acks applied at %v and %v, switched at %d", p, ta, tb, p.SwitchIndex)
	}
	// Plan 2: worker wa acknowledges for one of its tasks only; its
	// report goes at once (held, it would block the test for minutes).
	must(fsm.ReconfigureQueryType, fsm.ReconfigureQueryRequest{Query: "q", Plan: fsm.ReconfigPlan{Epoch: 2,
		Changes: []fsm.OperatorChange{{Operator: "f", Version: 3, SpecJSON: []byte(`{}`)}}}})
	partial := make(chan error, 1)
	go func() { partial <- report("wa", 2, src) }()
	waitFor(t, 15*time.Second, "the partial report written", func() bool {
		ta, _ := s.State().Task(nil, src)
		return ta != nil && ta.ReconfigAcked == 2
	})
	if err := <-partial; err != nil {
		t.Fatal(err)
	}
}

// ackPlan is query q with plan 1 committed (ackPlanSetUp): tasks src
// and src1 on worker wa, f on wb.
type ackPlan struct {
	ctx          context.Context
	src, src1, f string
	// must commits a command; report sends worker's report
	// acknowledging acked for tasks ids (generation 1) through
	// ReportTasks.
	must   func(fsm.MessageType, any)
	report func(worker string, acked uint64, ids ...string) error
}

// ackPlanSetUp waits for s's leader duties, registers workers wa and wb,
// runs query q and commits plan 1; s holds a report for a batch hold
// long at most.
func ackPlanSetUp(t *testing.T, s *Server, hold time.Duration) *ackPlan {
	t.Helper()
	// s may not have been elected yet (a one-node cluster just started):
	// ackPlanTrySetUp takes a node not leader for one that lost it.
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	p, err := ackPlanTrySetUp(t, s, hold)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// errSetUpLeaderMoved: the node a set-up wrote through lost the
// leadership before the set-up was done.
var errSetUpLeaderMoved = errors.New("the leadership moved during the set-up")

// ackPlanTrySetUp is ackPlanSetUp for s seen leader (c.leader()),
// returning errSetUpLeaderMoved when s is no longer, or stops being, the
// leader before it is done: on a loaded
// machine an election can come at any time (seen at load 40), and a
// caller with more than one node sets up again on the new leader. Each
// step is skipped when the state already holds it, so that a write that
// committed, though s reported leadership lost, is not done twice.
func ackPlanTrySetUp(t *testing.T, s *Server, hold time.Duration) (*ackPlan, error) {
	t.Helper()
	waitFor(t, 30*time.Second, "leader duties running, or the leadership gone", func() bool { return s.leading.Load() || !s.IsLeader() })
	if !s.leading.Load() {
		return nil, errSetUpLeaderMoved
	}
	p := &ackPlan{ctx: ctxT(t, 3*time.Minute), src: fsm.TaskID("q", "src", 0, 0), src1: fsm.TaskID("q", "src", 1, 0), f: fsm.TaskID("q", "f", 0, 0)}
	p.must = func(typ fsm.MessageType, body any) {
		t.Helper()
		res, err := s.apply(p.ctx, typ, body)
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
	}
	// step commits body unless done holds in s's state.
	step := func(typ fsm.MessageType, body any, done func() bool) error {
		if done() {
			return nil
		}
		res, err := s.apply(p.ctx, typ, body)
		switch {
		case err != nil && (!s.IsLeader() || status.Code(err) == codes.Unavailable): // "leadership lost while committing"
			return fmt.Errorf("%w: %s: %v", errSetUpLeaderMoved, typ, err)
		case err == nil && res.Err != nil:
			err = res.Err
		}
		if err != nil {
			return fmt.Errorf("%s: %w", typ, err)
		}
		return nil
	}
	for _, w := range []string{"wa", "wb"} {
		if err := step(fsm.RegisterWorkerType, fsm.RegisterWorkerRequest{Worker: fsm.Worker{ID: w, Name: w, Org: s.cfg.Org, Addr: w + ":1", Cores: 2}}, func() bool {
			got, _ := s.State().Worker(nil, w)
			return got != nil
		}); err != nil {
			return nil, err
		}
	}
	query := func() *fsm.Query {
		q, _ := s.State().Query(nil, "q")
		return q
	}
	if err := step(fsm.SubmitQueryType, fsm.SubmitQueryRequest{Query: fsm.Query{Name: "q", Status: fsm.QueryStatusRunning}, Tasks: []fsm.Task{
		{ID: p.src, Query: "q", Fragment: "src", WorkerID: "wa"}, {ID: p.src1, Query: "q", Fragment: "src", Partition: 1, WorkerID: "wa"},
		{ID: p.f, Query: "q", Fragment: "f", WorkerID: "wb"}}}, func() bool { return query() != nil }); err != nil {
		return nil, err
	}
	if err := step(fsm.ReconfigureQueryType, fsm.ReconfigureQueryRequest{Query: "q", Plan: fsm.ReconfigPlan{Epoch: 1,
		Changes: []fsm.OperatorChange{{Operator: "f", Version: 2, SpecJSON: []byte(`{}`)}}}}, func() bool {
		q := query()
		return q != nil && q.Reconfig != nil && len(q.Reconfig.Plans) > 0
	}); err != nil {
		return nil, err
	}
	p.report = func(worker string, acked uint64, ids ...string) error {
		return ackReport(p.ctx, s, worker, 1, acked, ids...)
	}
	s.acks.mu.Lock()
	s.acks.holdFor = hold
	s.acks.mu.Unlock()
	return p, nil
}

// ackPlanNode is a one-node cluster set up by ackPlanSetUp, writing
// each report at once (the tests look at the state between reports).
func ackPlanNode(t *testing.T) (*Server, *ackPlan) {
	t.Helper()
	s := newTestCluster(t, 1, "", "").nodes[0]
	return s, ackPlanSetUp(t, s, time.Millisecond)
}

// reportHeld sends worker's report acknowledging plan 1 for ids to s in
// the background and waits until s holds it for a batch; the channel
// gets the report's outcome.
func (p *ackPlan) reportHeld(t *testing.T, s *Server, worker string, ids ...string) <-chan error {
	t.Helper()
	out := make(chan error, 1)
	go func() { out <- p.report(worker, 1, ids...) }()
	waitFor(t, 10*time.Second, "the first report held", func() bool {
		s.acks.mu.Lock()
		defer s.acks.mu.Unlock()
		return len(s.acks.parked) == 1
	})
	return out
}

// ackReport sends worker's report to s acknowledging epoch acked for the
// copies of generation gen of tasks ids.
func ackReport(ctx context.Context, s *Server, worker string, gen int32, acked uint64, ids ...string) error {
	req := &pb.ReportTasksRequest{WorkerId: worker}
	for _, id := range ids {
		req.Tasks = append(req.Tasks, &pb.TaskState{TaskId: id, State: states.TaskRunning, Generation: gen,
			Reconfig: &pb.ReconfigProgress{Acked: acked, Frontier: 1000}})
	}
	_, err := (&workerService{s: s}).ReportTasks(ctx, req)
	return err
}

// ackNotice sends worker's NoteReconfigAcks to s (direct: nil client)
// or through client, acknowledging epoch acked for the copies of
// generation gen of tasks ids.
func ackNotice(ctx context.Context, s *Server, client pb.WorkerServiceClient, worker string, gen int32, acked uint64, ids ...string) error {
	req := &pb.ReportTasksRequest{WorkerId: worker}
	for _, id := range ids {
		req.Tasks = append(req.Tasks, &pb.TaskState{TaskId: id, Generation: gen, Reconfig: &pb.ReconfigProgress{Acked: acked}})
	}
	var err error
	if client != nil {
		_, err = client.NoteReconfigAcks(ctx, req)
	} else {
		_, err = (&workerService{s: s}).NoteReconfigAcks(ctx, req)
	}
	return err
}

// planPhase is the phase of query q's plan 1 in s's state.
func planPhase(t *testing.T, s *Server) string {
	t.Helper()
	q, err := s.State().Query(nil, "q")
	if err != nil || q == nil || q.Reconfig == nil || len(q.Reconfig.Plans) == 0 {
		t.Fatal(q, err)
	}
	return q.Reconfig.Plans[0].Phase
}

// TestReconfigUpdateDoneWhenTheLeaderHasEveryAck: the leader records a
// live update as done (ReconfigAcksReceived, the time `bench reconfig`
// takes) only once it holds the acknowledgement of every task from the
// copy its state places the task on: a task that never acknowledges, or
// whose acknowledgement comes from an older copy (another generation),
// keeps the plan loading and the update not done; its acknowledgement
// completes both. (Before, an older copy's acknowledgement counted in
// the leader's record.) The update starts when the state machine applied
// the plan (ReconfigCommitted).
func TestReconfigUpdateDoneWhenTheLeaderHasEveryAck(t *testing.T) {
	t.Parallel()
	s, p := ackPlanNode(t)
	ctx, report, src, src1, f := p.ctx, p.report, p.src, p.src1, p.f
	if s.ReconfigCommitted("q", 1).IsZero() || !s.ReconfigCommitted("q", 2).IsZero() {
		t.Fatalf("plan 1 applied at %v, plan 2 (none) at %v", s.ReconfigCommitted("q", 1), s.ReconfigCommitted("q", 2))
	}
	if err := report("wa", 1, src, src1); err != nil {
		t.Fatal(err)
	}
	if err := ackReport(ctx, s, "wb", 7, 1, f); err != nil { // not the copy placed (generation 1)
		t.Fatal(err)
	}
	if got := s.ReconfigAcksReceived("q", 1); !got.IsZero() || planPhase(t, s) != fsm.ReconfigLoading {
		t.Fatalf("task f never acknowledged (its older copy did), yet the update is done at %v, plan %s", got, planPhase(t, s))
	}
	if err := report("wb", 1, f); err != nil {
		t.Fatal(err)
	}
	if got := s.ReconfigAcksReceived("q", 1); got.IsZero() || planPhase(t, s) != fsm.ReconfigSwitched {
		t.Fatalf("every task acknowledged, yet the update is done at %v, plan %s", got, planPhase(t, s))
	}
}

// TestReconfigAcksSurviveALeaderChange: a report held by the leader for
// a batch is failed, not lost, when the leadership moves before it is
// written, so its worker reports again to the new leader; the plan then
// switches there, and the new leader records the update done from the
// reports it received. The old leader never recorded it.
func TestReconfigAcksSurviveALeaderChange(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, "", "")
	var l int
	var old *Server
	var p *ackPlan
	for give := time.Now().Add(2 * time.Minute); p == nil; {
		if time.Now().After(give) {
			t.Fatal("the leadership moved during every set-up for 2 minutes")
		}
		l = c.leader()
		old = c.nodes[l]
		var err error
		p, err = ackPlanTrySetUp(t, old, 5*time.Minute) // held until the leadership moves
		if err != nil && !errors.Is(err, errSetUpLeaderMoved) {
			t.Fatal(err)
		}
	}
	ctx, src, src1, f := p.ctx, p.src, p.src1, p.f
	first := p.reportHeld(t, old, "wa", src, src1)
	if err := awaitFuture(ctx, old.raft.LeadershipTransfer()); err != nil {
		t.Fatal(err)
	}
	var leader *Server
	waitFor(t, 30*time.Second, "a new leader's duties running", func() bool {
		for i, n := range c.nodes {
			if i != l && n.IsLeader() && n.leading.Load() {
				leader = n
				return true
			}
		}
		return false
	})
	select {
	case err := <-first:
		if err == nil {
			t.Fatal("the report held by the old leader returned success, yet it was never written")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the report held by the old leader did not return when the leadership moved")
	}
	// A notice sent to the old leader, now a follower, is forwarded to
	// the new one (it writes nothing: the update is not done there yet).
	if err := ackNotice(ctx, nil, c.workers(l), "wa", 1, 1, src, src1); err != nil {
		t.Fatal(err)
	}
	if got := old.ReconfigAcksReceived("q", 1); !got.IsZero() {
		t.Fatalf("the old leader recorded the update done at %v from a notice it forwarded", got)
	}
	if err := ackReport(ctx, leader, "wb", 1, 1, f); err != nil {
		t.Fatal(err)
	}
	if got := leader.ReconfigAcksReceived("q", 1); got.IsZero() {
		t.Fatal("the new leader holds every acknowledgement (wa's forwarded notice, wb's report), yet not the update done")
	}
	if err := ackReport(ctx, leader, "wa", 1, 1, src, src1); err != nil { // the worker reports again
		t.Fatal(err)
	}
	if got := leader.ReconfigAcksReceived("q", 1); got.IsZero() || planPhase(t, leader) != fsm.ReconfigSwitched {
		t.Fatalf("every task acknowledged to the new leader, yet the update is done at %v, plan %s", got, planPhase(t, leader))
	}
	if got := old.ReconfigAcksReceived("q", 1); !got.IsZero() {
		t.Fatalf("the old leader never had every acknowledgement, yet recorded the update done at %v", got)
	}
	// A worker whose watch moves to another coordinator names the plans
	// it got from the new leader: the old one, once it applied the same
	// state, gives them the same digests and leaves their JSON out.
	held := watchPlans(t, ctx, leader, "wa")
	waitFor(t, 30*time.Second, "the old leader's watch leaving out the plans held", func() bool {
		v := watchPlans(t, ctx, old, "wa", held.ReconfigPlanDigests...)
		return slices.Equal(v.ReconfigPlanDigests, held.ReconfigPlanDigests) && !slices.ContainsFunc(v.ReconfigPlansJson, func(b []byte) bool { return len(b) > 0 })
	})
}

// watchPlans is query q's view in s's answer to worker's assignment
// watch (index 0) naming the plans have.
func watchPlans(t *testing.T, ctx context.Context, s *Server, worker string, have ...uint64) *pb.QueryView {
	t.Helper()
	resp, err := (&workerService{s: s}).WatchAssignments(ctx, &pb.WatchAssignmentsRequest{WorkerId: worker, ReconfigPlans: true, ReconfigPlansHave: have})
	if err != nil || len(resp.Queries) != 1 || !resp.Queries[0].ReconfigState {
		t.Fatalf("watch: %v, %v", resp, err)
	}
	return resp.Queries[0]
}

// TestReconfigAckNoticeHeldAheadOfItsWrite: a worker's notice of
// acknowledgements (NoteReconfigAcks, sent while its report loop waits
// for an earlier report's write) puts them in the leader's record
// without writing anything: the update is done once the leader holds
// every task's acknowledgement, the plan still loads in Raft until the
// report that follows is written, which switches it. A notice from a
// copy the state does not place (another generation) counts for nothing,
// one from an unknown worker is refused.
func TestReconfigAckNoticeHeldAheadOfItsWrite(t *testing.T) {
	t.Parallel()
	s, p := ackPlanNode(t)
	ctx, report, src, src1, f := p.ctx, p.report, p.src, p.src1, p.f
	if err := report("wa", 1, src, src1); err != nil {
		t.Fatal(err)
	}
	if err := ackNotice(ctx, s, nil, "wb", 7, 1, f); err != nil { // not the copy placed (generation 1)
		t.Fatal(err)
	}
	if got := s.ReconfigAcksReceived("q", 1); !got.IsZero() {
		t.Fatalf("task f's copy never acknowledged (an older one did), yet the update is done at %v", got)
	}
	if err := ackNotice(ctx, s, nil, "wz", 1, 1, f); status.Code(err) != codes.NotFound {
		t.Fatalf("a notice from an unknown worker: %v, want NotFound", err)
	}
	before := s.raft.LastIndex()
	if err := ackNotice(ctx, s, nil, "wb", 1, 1, f); err != nil {
		t.Fatal(err)
	}
	if got := s.ReconfigAcksReceived("q", 1); got.IsZero() {
		t.Fatal("every task acknowledged (f by a notice), yet the leader does not hold the update done")
	}
	if tf, _ := s.State().Task(nil, f); tf == nil || tf.ReconfigAcked != 0 || planPhase(t, s) != fsm.ReconfigLoading || s.raft.LastIndex() != before {
		t.Fatalf("a notice wrote something: task f %+v, plan %s, log %d -> %d", tf, planPhase(t, s), before, s.raft.LastIndex())
	}
	if err := report("wb", 1, f); err != nil {
		t.Fatal(err)
	}
	if planPhase(t, s) != fsm.ReconfigSwitched {
		t.Fatalf("the report after the notice was written, yet the plan is %s", planPhase(t, s))
	}
}

// TestWatchLeavesOutPlansTheWorkerHolds: the assignment watch leaves out
// the JSON of the plans a worker names as held (by digest), also on the
// first watch after it reconnects (index 0), sends the others, and a
// worker that names a plan no longer current (or nothing) gets every
// plan as it is now.
func TestWatchLeavesOutPlansTheWorkerHolds(t *testing.T) {
	t.Parallel()
	s, p := ackPlanNode(t)
	watch := func(have ...uint64) *pb.QueryView { return watchPlans(t, p.ctx, s, "wa", have...) }
	first := watch()
	if len(first.ReconfigPlansJson) != 1 || len(first.ReconfigPlanDigests) != 1 || first.ReconfigPlanDigests[0] != PlanDigest(first.ReconfigPlansJson[0]) {
		t.Fatalf("first watch: plans %q, digests %x", first.ReconfigPlansJson, first.ReconfigPlanDigests)
	}
	p.must(fsm.ReconfigureQueryType, fsm.ReconfigureQueryRequest{Query: "q", Plan: fsm.ReconfigPlan{Epoch: 2,
		Changes: []fsm.OperatorChange{{Operator: "f", Version: 3, SpecJSON: []byte(`{}`)}}}})
	// Plan 1 is still loading, unchanged: held.
	v := watch(first.ReconfigPlanDigests[0])
	if len(v.ReconfigPlansJson) != 2 || len(v.ReconfigPlansJson[0]) != 0 || len(v.ReconfigPlansJson[1]) == 0 ||
		v.ReconfigPlanDigests[0] != first.ReconfigPlanDigests[0] || v.ReconfigPlanDigests[1] != PlanDigest(v.ReconfigPlansJson[1]) {
		t.Fatalf("watch naming plan 1: plans %q, digests %x", v.ReconfigPlansJson, v.ReconfigPlanDigests)
	}
	var plan2 fsm.ReconfigPlan
	if err := json.Unmarshal(v.ReconfigPlansJson[1], &plan2); err != nil || plan2.Epoch != 2 {
		t.Fatalf("plan 2 sent as %s: %v", v.ReconfigPlansJson[1], err)
	}
	// Plan 1 switches: the digest the worker holds is no longer current.
	if err := p.report("wa", 2, p.src, p.src1); err != nil {
		t.Fatal(err)
	}
	if err := p.report("wb", 2, p.f); err != nil {
		t.Fatal(err)
	}
	v = watch(first.ReconfigPlanDigests[0], 12345)
	if len(v.ReconfigPlansJson) != 2 || len(v.ReconfigPlansJson[0]) == 0 || v.ReconfigPlanDigests[0] == first.ReconfigPlanDigests[0] {
		t.Fatalf("watch naming plan 1 as it was before its switch: plans %q, digests %x", v.ReconfigPlansJson, v.ReconfigPlanDigests)
	}
}
