package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	memdb "github.com/hashicorp/go-memdb"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// rcBenchQuery has 4 vitals partitions, a filter of 4 and an aggregate of
// 4 (the filter is fused into the sources), so 8 tasks placed by the
// scheduler over the benchmark's three workers.
const rcBenchQuery = `name: rb
sources:
  - {name: vitals, parallelism: 4, schema: {time: timestamp, patient: string, temperature: float, heart_rate: int, resp_rate: int, bp_sys: int, bp_dia: int}, generator: {kind: vitals, rate: 100, seed: 1}}
operators:
  - {name: hot, type: filter, input: vitals, parallelism: 4, where: "temperature > 38.000"}
  - {name: per_patient, type: aggregate, input: hot, parallelism: 4, window: {size: 1s}, group_by: [patient], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_patient}
`

// rcAckTimes is when one plan reached each step of a live update, as
// seen by the benchmark (one worker's times: the last of the workers).
type rcAckTimes struct {
	committed, woke, built, fired, sent, switched time.Time
}

// fakeRCWorker is a worker of BenchmarkReconfigAckPath: it long-polls its
// assignments over gRPC like a real worker and acknowledges every plan
// it is handed at once (its tasks "install" in no time: the runtime's
// share is what `bench reconfig` reports as learned -> installed), and
// reports the markers of a switched plan so that it completes. With
// delta it names the plans it holds (reconfig_plans_have), as a worker
// does, and the coordinator leaves their JSON out.
func fakeRCWorker(ctx context.Context, client pb.WorkerServiceClient, id string, delta bool, note func(worker string, index, e uint64, size int, fired, sent time.Time)) error {
	var index uint64
	acked, level := uint64(0), uint64(0)
	// Plans decoded by their JSON, as a worker keeps them (specCache):
	// only a plan new or changed since the last response is decoded.
	decoded := map[string]fsm.ReconfigPlan{}
	held := map[uint64]fsm.ReconfigPlan{} // the same, by digest
	for ctx.Err() == nil {
		req := &pb.WatchAssignmentsRequest{WorkerId: id, MinIndex: index, MaxWaitMs: 10000, ReconfigPlans: true}
		if delta {
			for d := range held {
				req.ReconfigPlansHave = append(req.ReconfigPlansHave, d)
			}
		}
		resp, err := client.WatchAssignments(ctx, req)
		if err != nil {
			return err
		}
		fired := time.Now()
		if resp.Index == index {
			continue
		}
		index = resp.Index
		var latest, switched uint64
		keep := map[string]fsm.ReconfigPlan{}
		keepHeld := map[uint64]fsm.ReconfigPlan{}
		for _, q := range resp.Queries {
			for i, raw := range q.ReconfigPlansJson {
				p, ok := decoded[string(raw)]
				if len(raw) == 0 {
					if p, ok = held[q.ReconfigPlanDigests[i]]; !ok {
						return fmt.Errorf("plan %d left out, not held", i+1)
					}
				} else if !ok {
					if err := json.Unmarshal(raw, &p); err != nil {
						return err
					}
				}
				keep[string(raw)] = p
				if i < len(q.ReconfigPlanDigests) {
					keepHeld[q.ReconfigPlanDigests[i]] = p
				}
				latest = max(latest, p.Epoch)
				if p.Phase != fsm.ReconfigLoading {
					switched = max(switched, p.Epoch)
				}
			}
		}
		decoded, held = keep, keepHeld
		if latest <= acked && switched <= level {
			continue
		}
		report := &pb.ReportTasksRequest{WorkerId: id}
		for _, a := range resp.Assignments {
			report.Tasks = append(report.Tasks, &pb.TaskState{TaskId: a.TaskId, State: states.TaskRunning, Generation: a.Generation,
				Reconfig: &pb.ReconfigProgress{Acked: latest, Level: switched, Frontier: 1000}})
		}
		sent := time.Now()
		if _, err := client.ReportTasks(ctx, report); err != nil {
			return err
		}
		if latest > acked {
			note(id, resp.Index, latest, proto.Size(resp), fired, sent)
		}
		acked, level = latest, switched
	}
	return ctx.Err()
}

// BenchmarkReconfigAckPath measures, step by step, the coordinator's part
// of a live update: the plan committed (UpdateQuery over gRPC), the
// assignment watch of the last of three workers woken on the coordinator
// (woke), its response built (built), the watch returned at the worker
// with it (fired; built -> fired is the response's transfer), the last
// acknowledgement sent (ReportTasks), the leader holding every task's
// acknowledgement, the Raft write of them begun, and the plan switched
// in the leader's state (every acknowledgement applied; written: the
// write's future answered). resp-bytes is the size of the watch
// responses that carried a plan. Each metric is
// the median over the iterations, in ms from the commit. The workers'
// own part (decode, build, install) is not in it: they acknowledge as
// soon as they are handed the plan. plans=all: the workers do not name
// the plans they hold, every response carries every plan's JSON;
// plans=new: they do, a response carries only the plans new to them.
//
//	go test -run '^$' -bench ReconfigAckPath -benchtime 30x ./coordinator/
func BenchmarkReconfigAckPath(b *testing.B) {
	for _, delta := range []bool{false, true} {
		b.Run(map[bool]string{false: "plans=all", true: "plans=new"}[delta], func(b *testing.B) { benchAckPath(b, delta) })
	}
}

// benchAckPath is BenchmarkReconfigAckPath, the workers naming the plans
// they hold or not (delta).
func benchAckPath(b *testing.B, delta bool) {
	tm := testTimings()
	tm.HeartbeatTTL = 10 * time.Minute // the fake workers never heartbeat
	// written: when each Raft write of reports was answered (the log
	// append, its fsyncs and the state machine done).
	var wmu sync.Mutex
	var written []time.Time
	var planWrites []float64
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	// served: when each watch (worker, index) woke and had its response.
	type watchKey struct {
		worker string
		index  uint64
	}
	served := map[watchKey][2]time.Time{}
	var respSizes []float64 // the plans' watch responses, bytes
	c := newTestClusterWith(b, 1, "", "", tm, func(cfg *Config) {
		cfg.hooks.watchServed = func(worker string, index uint64, woke, built time.Time) {
			wmu.Lock()
			served[watchKey{worker, index}] = [2]time.Time{woke, built}
			wmu.Unlock()
		}
		cfg.hooks.applyFuture = func(mt fsm.MessageType, f raft.ApplyFuture) raft.ApplyFuture {
			if mt == fsm.ReconfigureQueryType {
				began := time.Now()
				return answeredFuture{f, func(at time.Time) { wmu.Lock(); planWrites = append(planWrites, ms(at.Sub(began))); wmu.Unlock() }}
			}
			if mt != fsm.UpdateTaskStatesBatchType && mt != fsm.UpdateTaskStatesType {
				return f
			}
			return answeredFuture{f, func(at time.Time) { wmu.Lock(); written = append(written, at); wmu.Unlock() }}
		}
	})
	s := c.nodes[0]
	waitFor(b, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	client := c.workers(0)
	ids := registerWorkers(b, client, 3, "rc")
	if _, err := c.admin(0).SubmitQuery(ctxT(b, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(rcBenchQuery), Filename: "rb.yaml"}); err != nil {
		b.Fatal(err)
	}
	waitFor(b, 30*time.Second, "every task placed", func() bool {
		tasks, _ := s.State().TasksByQuery(nil, "rb")
		return len(tasks) > 0 && !slices.ContainsFunc(tasks, func(t *fsm.Task) bool { return t.WorkerID == "" })
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var mu sync.Mutex
	times := map[uint64]*rcAckTimes{}
	at := func(e uint64) *rcAckTimes {
		if times[e] == nil {
			times[e] = &rcAckTimes{}
		}
		return times[e]
	}
	phase := make(chan struct{}, 1)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := fakeRCWorker(ctx, client, id, delta, func(w string, index, e uint64, size int, fired, sent time.Time) {
				wmu.Lock()
				sv := served[watchKey{w, index}]
				respSizes = append(respSizes, float64(size))
				wmu.Unlock()
				mu.Lock()
				defer mu.Unlock()
				t := at(e)
				t.woke, t.built = later(t.woke, sv[0]), later(t.built, sv[1])
				t.fired, t.sent = later(t.fired, fired), later(t.sent, sent)
			})
			if err != nil && ctx.Err() == nil {
				b.Errorf("worker %s: %v", id, err)
			}
		}()
	}
	// The leader's state, watched like `bench reconfig` does.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			ws := memdb.NewWatchSet()
			q, err := s.State().Query(ws, "rb")
			now := time.Now()
			if err == nil && q != nil && q.Reconfig != nil {
				mu.Lock()
				for _, p := range q.Reconfig.Plans {
					t := at(p.Epoch)
					if t.committed.IsZero() {
						t.committed = now
					}
					if p.Phase != fsm.ReconfigLoading && t.switched.IsZero() {
						t.switched = now
					}
				}
				mu.Unlock()
				if q.Reconfig.Completed() > 0 {
					select {
					case phase <- struct{}{}:
					default:
					}
				}
			}
			if ws.WatchCtx(ctx) != nil {
				return
			}
		}
	}()
	rcs := pb.NewReconfigServiceClient(c.conn(0, c.tokens[1]))
	var woke, built, fired, sent, received, began, done, switched []float64
	first := s.raft.LastIndex()
	b.ResetTimer()
	for i := range b.N {
		yaml := strings.Replace(rcBenchQuery, "38.000", fmt.Sprintf("%.3f", 38+float64(i+1)/1000), 1)
		resp, err := rcs.UpdateQuery(ctxT(b, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(yaml), Filename: "rb.yaml"})
		if err != nil {
			b.Fatal(err)
		}
		e := resp.Epoch
		waitForSignal(b, phase, "plan complete", func() bool {
			q, _ := s.State().Query(nil, "rb")
			return q != nil && q.Reconfig.Completed() >= e
		})
		mu.Lock()
		t := *at(e)
		mu.Unlock()
		if c := s.ReconfigCommitted("rb", e); !c.IsZero() {
			t.committed = c // the state machine's apply, not the watch's wake
		}
		if testing.Verbose() {
			b.Logf("e %d: woke %.3f built %.3f fired %.3f", e, ms(t.woke.Sub(t.committed)), ms(t.built.Sub(t.committed)), ms(t.fired.Sub(t.committed)))
		}
		woke, built = append(woke, ms(t.woke.Sub(t.committed))), append(built, ms(t.built.Sub(t.committed)))
		fired, sent, switched = append(fired, ms(t.fired.Sub(t.committed))), append(sent, ms(t.sent.Sub(t.committed))), append(switched, ms(t.switched.Sub(t.committed)))
		if r := s.ReconfigAcksReceived("rb", e); !r.IsZero() {
			received = append(received, ms(r.Sub(t.committed)))
		}
		if r := s.ReconfigAcksWriteBegan("rb", e); !r.IsZero() {
			began = append(began, ms(r.Sub(t.committed)))
			wmu.Lock()
			if i := slices.IndexFunc(written, func(w time.Time) bool { return !w.Before(r) }); i >= 0 {
				done = append(done, ms(written[i].Sub(t.committed)))
			}
			wmu.Unlock()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(s.raft.LastIndex()-first)/float64(b.N), "entries/update")
	for _, m := range []struct {
		unit string
		v    []float64
	}{{"resp-bytes", respSizes}, {"woke-ms", woke}, {"built-ms", built}, {"fired-ms", fired}, {"sent-ms", sent}, {"received-ms", received}, {"write-began-ms", began}, {"written-ms", done}, {"switched-ms", switched}, {"plan-write-ms", planWrites}} {
		if len(m.v) > 0 {
			slices.Sort(m.v)
			b.ReportMetric(m.v[len(m.v)/2], m.unit)
		}
	}
}

// answeredFuture tells done when its write was answered.
type answeredFuture struct {
	raft.ApplyFuture
	done func(time.Time)
}

func (f answeredFuture) Error() error {
	err := f.ApplyFuture.Error()
	f.done(time.Now())
	return err
}

// waitForSignal waits until cond holds, rechecking at every signal on ch
// (and every 10 ms in case one was missed).
func waitForSignal(t testing.TB, ch <-chan struct{}, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-ch:
		case <-time.After(10 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
