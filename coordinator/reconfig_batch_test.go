package coordinator

import (
	"testing"
	"time"

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
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	ctx := ctxT(t, 3*time.Minute)
	must := func(typ fsm.MessageType, body any) {
		t.Helper()
		res, err := s.apply(ctx, typ, body)
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
	}
	for _, w := range []string{"wa", "wb"} {
		must(fsm.RegisterWorkerType, fsm.RegisterWorkerRequest{Worker: fsm.Worker{ID: w, Name: w, Org: s.cfg.Org, Addr: w + ":1", Cores: 2}})
	}
	src, src1, f := fsm.TaskID("q", "src", 0, 0), fsm.TaskID("q", "src", 1, 0), fsm.TaskID("q", "f", 0, 0)
	must(fsm.SubmitQueryType, fsm.SubmitQueryRequest{Query: fsm.Query{Name: "q", Status: fsm.QueryStatusRunning}, Tasks: []fsm.Task{
		{ID: src, Query: "q", Fragment: "src", WorkerID: "wa"}, {ID: src1, Query: "q", Fragment: "src", Partition: 1, WorkerID: "wa"},
		{ID: f, Query: "q", Fragment: "f", WorkerID: "wb"}}})
	must(fsm.ReconfigureQueryType, fsm.ReconfigureQueryRequest{Query: "q", Plan: fsm.ReconfigPlan{Epoch: 1,
		Changes: []fsm.OperatorChange{{Operator: "f", Version: 2, SpecJSON: []byte(`{}`)}}}})
	s.acks.mu.Lock()
	s.acks.holdFor = 5 * time.Minute // the test decides when the second report comes
	s.acks.mu.Unlock()
	ws := &workerService{s: s}
	report := func(worker string, acked uint64, ids ...string) error {
		req := &pb.ReportTasksRequest{WorkerId: worker}
		for _, id := range ids {
			req.Tasks = append(req.Tasks, &pb.TaskState{TaskId: id, State: states.TaskRunning, Generation: 1,
				Reconfig: &pb.ReconfigProgress{Acked: acked, Frontier: 1000}})
		}
		_, err := ws.ReportTasks(ctx, req)
		return err
	}
	first := make(chan error, 1)
	go func() { first <- report("wa", 1, src, src1) }()
	waitFor(t, 10*time.Second, "the first report held", func() bool {
		s.acks.mu.Lock()
		defer s.acks.mu.Unlock()
		return len(s.acks.parked) == 1
	})
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
