package coordinator

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestPlanFieldsWaitForEveryCoordinator: a plan using fields an older
// build would ignore (a live move here) is refused while a coordinator
// advertises protocol 3, naming it, and proposed once it advertises the
// current protocol; a plan without them goes through meanwhile.
func TestPlanFieldsWaitForEveryCoordinator(t *testing.T) {
	// Not parallel: beside the others on a loaded machine, its first plan
	// waited out its 20 s deadline once (the plan applier busy).
	c := newTestCluster(t, 3, "", "")
	l := c.leader()
	s := c.nodes[l]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	old := (l + 1) % 3
	setProto := func(v int) {
		t.Helper()
		nt := map[string]string{}
		for k, val := range c.nodes[old].serf.LocalMember().Tags {
			nt[k] = val
		}
		nt[tagProto] = strconv.Itoa(v)
		if err := c.nodes[old].serf.SetTags(nt); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "the tag to spread", func() bool {
			v2, err := s.coordinatorProtocols()
			return err == nil && v2[c.cfgs[old].NodeID] == v
		})
	}
	live := fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, Placements: []fsm.PlannedPlacement{{TaskID: "q/f/p0/r0", FromGeneration: 1, ToWorker: "w", Live: true}}}
	plain := live
	plain.Placements = []fsm.PlannedPlacement{{TaskID: "q/f/p0/r0", FromGeneration: 1, ToWorker: "w"}}
	// Each plan its own deadline: one context for all three also timed
	// setProto's waits for gossip.
	setProto(3)
	if _, err := s.submitPlan(ctxT(t, 20*time.Second), live); !errors.Is(err, ErrCommandNotSupported) {
		t.Fatalf("live move with a protocol-3 coordinator: %v, want ErrCommandNotSupported", err)
	}
	if _, err := s.submitPlan(ctxT(t, 20*time.Second), plain); err != nil {
		t.Fatalf("plain plan with a protocol-3 coordinator: %v", err)
	}
	setProto(fsm.ProtocolVersion)
	out, err := s.submitPlan(ctxT(t, 20*time.Second), live)
	if err != nil || len(out.Result.Refused) != 1 {
		t.Fatalf("live move once every coordinator upgraded: %+v, %v (want the unknown task refused)", out, err)
	}
}

const rescaleQuery = `name: kq
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_line}
`

// TestLeaderResumesRescales: a rescale a previous leader left prepared is
// aborted by the next leader's duties (the map's next dropped, the tasks
// created for it deleted), and ScaleQuery refuses what cannot rescale.
func TestLeaderResumesRescales(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	admin := c.admin(0)
	if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(rescaleQuery), Filename: "kq.yaml"}); err != nil {
		t.Fatal(err)
	}
	var m *fsm.SlotMap
	waitFor(t, 20*time.Second, "the slot map created", func() bool {
		m, _ = s.State().SlotMap(nil, "kq", "per_line")
		return m != nil
	})
	for _, tc := range []struct {
		op   string
		n    int32
		want codes.Code
	}{{"text", 2, codes.FailedPrecondition}, {"nope", 2, codes.NotFound}, {"per_line", 0, codes.InvalidArgument}, {"per_line", MaxParallelism + 1, codes.InvalidArgument}} {
		if _, err := admin.ScaleQuery(ctxT(t, 10*time.Second), &pb.ScaleQueryRequest{Query: "kq", Operator: tc.op, Parallelism: tc.n}); status.Code(err) != tc.want {
			t.Errorf("scale %s to %d: %v, want %v", tc.op, tc.n, err, tc.want)
		}
	}
	// What a leader lost right after its prepare leaves behind.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prep := fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale,
		NewTasks: []fsm.PlannedTask{{Query: "kq", Fragment: "per_line", Partition: 1, Replica: 0, ScaleEpoch: m.Epoch + 1}},
		SlotMaps: []fsm.SlotMapUpdate{{Query: "kq", Fragment: "per_line", QueryIndex: m.QueryIndex, ExpectedEpoch: m.Epoch,
			Partitions: 2, Ranges: fsm.ContiguousSlotMap(2), Phase: fsm.RescalePrepare}}}
	if out, err := s.submitPlan(ctx, prep); err != nil || len(out.Result.Refused) > 0 {
		t.Fatalf("prepare: %+v, %v", out, err)
	}
	if m, _ = s.State().SlotMap(nil, "kq", "per_line"); m.Next == nil {
		t.Fatal("prepare not applied")
	}
	if _, err := admin.ScaleQuery(ctxT(t, 10*time.Second), &pb.ScaleQueryRequest{Query: "kq", Operator: "per_line", Parallelism: 3}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("scale while a rescale is under way: %v, want FailedPrecondition", err)
	}
	s.resumeRescales(ctx, nil)
	if m, _ = s.State().SlotMap(nil, "kq", "per_line"); m.Next != nil || m.Partitions != 1 {
		t.Fatalf("after resume: %+v next %+v", m, m.Next)
	}
	if tk, _ := s.State().Task(nil, fsm.TaskID("kq", "per_line", 1, 0)); tk != nil {
		t.Fatalf("the task created for the abandoned rescale is still there: %+v", tk)
	}
}

// TestRescaleFinishEndsAtShutdown: a rescale past its go waits for every
// task to pass the cut, also after its caller has gone; a coordinator
// shutting down does not wait for that (up to the rescale's two-minute
// stall time, holding the leader's duties and so the shutdown): the next
// leader finishes it.
func TestRescaleFinishEndsAtShutdown(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	if _, err := c.admin(0).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(rescaleQuery), Filename: "kq.yaml"}); err != nil {
		t.Fatal(err)
	}
	var m *fsm.SlotMap
	waitFor(t, 20*time.Second, "the slot map created", func() bool {
		m, _ = s.State().SlotMap(nil, "kq", "per_line")
		return m != nil
	})
	tg, err := s.rescaleTarget("kq", "per_line")
	if err != nil {
		t.Fatal(err)
	}
	// A rescale to 1 partition with other owners, prepared and past its
	// go, that no task will ever report having passed (no workers).
	ranges := []fsm.SlotRange{{First: 0, Last: fsm.NumSlots - 1, Partition: 0}}
	ctx := ctxT(t, 20*time.Second)
	for _, phase := range []string{fsm.RescalePrepare, fsm.RescaleGo} {
		u := fsm.SlotMapUpdate{Query: "kq", Fragment: "per_line", QueryIndex: m.QueryIndex, ExpectedEpoch: m.Epoch, Partitions: 1, Ranges: ranges, Phase: phase, Cut: 1}
		if out, err := s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, SlotMaps: []fsm.SlotMapUpdate{u}}); err != nil || len(out.Result.Refused) > 0 {
			t.Fatalf("%s: %+v, %v", phase, out, err)
		}
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel() // the caller has gone
	done := make(chan error, 1)
	go func() {
		_, err := s.finishRescale(gone, tg, m.Epoch+1, 1)
		done <- err
	}()
	c.shutdown()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the finish succeeded without any task passing the cut")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the rescale's finish still waits 30 s after the shutdown")
	}
}

// TestStalledRescaleResumedWithoutLeaderChange: a rescale's finish waits
// while the tasks it waits for work (however long: here four times the
// stall time) and gives up only once none of them progresses for the
// stall time; the rescale it left under way is then finished by the
// leader's resumer, without a change of leader, once the tasks pass the
// cut.
func TestStalledRescaleResumedWithoutLeaderChange(t *testing.T) {
	const stall = 500 * time.Millisecond
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) {
		cfg.hooks.rescaleStall, cfg.hooks.resumeEvery = stall, 200*time.Millisecond
	})
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	ctx := ctxT(t, 60*time.Second)
	// A worker record for the tasks to be placed on (their reports are
	// the worker's): no process behind it, kept from expiring.
	s.liveness.touch("w1", time.Now().Add(time.Hour))
	if res, err := s.apply(ctx, fsm.RegisterWorkerType, fsm.RegisterWorkerRequest{Worker: fsm.Worker{ID: "w1", Addr: "127.0.0.1:1", Cores: 8, Status: statusReady}}); err != nil || res.Err != nil {
		t.Fatalf("register: %v %v", err, res)
	}
	if _, err := c.admin(0).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(rescaleQuery), Filename: "kq.yaml"}); err != nil {
		t.Fatal(err)
	}
	var tasks []*fsm.Task
	waitFor(t, 20*time.Second, "the slot map created and the tasks placed", func() bool {
		m, _ := s.State().SlotMap(nil, "kq", "per_line")
		tasks, _ = s.State().TasksByQuery(nil, "kq")
		for _, tk := range tasks {
			if tk.WorkerID != "w1" {
				return false
			}
		}
		return m != nil && len(tasks) > 0
	})
	// goRescale puts a rescale of per_line (the same single partition,
	// its slots re-owned) past its go, as a rescale does before its
	// finish, and returns its epoch. scaleMu is held: no resumer meddles.
	goRescale := func() (*rescaleTarget, uint64) {
		t.Helper()
		m, _ := s.State().SlotMap(nil, "kq", "per_line")
		tg, err := s.rescaleTarget("kq", "per_line")
		if err != nil {
			t.Fatal(err)
		}
		ranges := []fsm.SlotRange{{First: 0, Last: fsm.NumSlots - 1, Partition: 0}}
		for _, phase := range []string{fsm.RescalePrepare, fsm.RescaleGo} {
			u := fsm.SlotMapUpdate{Query: "kq", Fragment: "per_line", QueryIndex: m.QueryIndex, ExpectedEpoch: m.Epoch, Partitions: 1, Ranges: ranges, Phase: phase, Cut: 1}
			if out, err := s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, SlotMaps: []fsm.SlotMapUpdate{u}}); err != nil || len(out.Result.Refused) > 0 {
				t.Fatalf("%s: %+v, %v", phase, out, err)
			}
		}
		return tg, m.Epoch + 1
	}
	// passCut reports every task of the query past the cut of epoch.
	passCut := func(epoch uint64) error {
		var ups []fsm.TaskStateUpdate
		for _, tk := range tasks {
			ups = append(ups, fsm.TaskStateUpdate{TaskID: tk.ID, State: "running", CutDone: epoch})
		}
		res, err := s.apply(ctx, fsm.UpdateTaskStatesType, fsm.UpdateTaskStatesRequest{WorkerID: "w1", States: ups})
		if err == nil {
			err = res.Err
		}
		return err
	}
	// working reports one-second sensor windows in which every task took
	// input, every 100 ms, until stop is closed.
	working := func(stop chan struct{}) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				now := time.Now()
				var ws []*pb.TaskStats
				for _, tk := range tasks {
					ws = append(ws, &pb.TaskStats{Task: tk.ID, InTps: 100, ReportedAtMs: now.UnixMilli(), WindowMs: 1000})
				}
				s.liveStats.put("w1", ws, now)
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		return done
	}

	// A finish whose tasks make no progress gives up after the stall.
	s.scaleMu.Lock()
	tg, epoch := goRescale()
	if _, err := s.finishRescale(ctx, tg, epoch, 1); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), ErrRescaleStalled.Error()) {
		s.scaleMu.Unlock()
		t.Fatalf("finish without progress: %v, want ErrRescaleStalled", err)
	}
	s.scaleMu.Unlock()
	// The resumer finishes it once the tasks pass the cut.
	if err := passCut(epoch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the resumer to finish the stalled rescale", func() bool {
		m, _ := s.State().SlotMap(nil, "kq", "per_line")
		return m.Next == nil && m.Epoch == epoch
	})

	// A finish whose tasks work through a backlog longer than the stall
	// time waits for them.
	s.scaleMu.Lock()
	defer s.scaleMu.Unlock()
	tg, epoch = goRescale()
	stop := make(chan struct{})
	done := working(stop)
	passed := make(chan error, 1)
	go func() {
		// Four stall times of work (the backlog) before the tasks pass
		// the cut.
		time.Sleep(4 * stall)
		passed <- passCut(epoch)
		close(stop)
	}()
	m, err := s.finishRescale(ctx, tg, epoch, 1)
	<-done
	if perr := <-passed; perr != nil {
		t.Fatal(perr)
	}
	if err != nil || m.Epoch != epoch {
		t.Fatalf("finish of a rescale making progress: %+v, %v", m, err)
	}
}
