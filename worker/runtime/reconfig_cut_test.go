package runtime

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/kafka/kafkatest"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestReconfigSourceReplicaLearnsTheCutLate hands a live plan's cut to
// every task but one replica of a source partition, and to that one
// only once its sibling has passed the cut: the late replica holds at
// the lowest cut the plan could get (its acknowledged frontier plus the
// margin) instead of passing the cut unknowingly, so both replicas
// switch at the cut and the two sinks' stable outputs are the same,
// version tags included. Without the hold the late replica went on
// past the cut under the old epoch and switched at a later boundary:
// sink replica 1's tuples between the two were tagged v1, replica 0's
// v2.
func TestReconfigSourceReplicaLearnsTheCutLate(t *testing.T) {
	const (
		limit  = 4000
		margin = 20 * time.Millisecond
		late   = "rc/lines/p0/r1"
	)
	// The sources go at a tenth of their rate until the late replica
	// held.
	r := startReplicaRun(t, limit)
	r.margin = margin
	r.waitAcked(r.addPlan(2).Epoch)
	loading := r.rc
	loading.Plans = slices.Clone(r.rc.Plans)
	// The coordinator's rule (fsm advanceReconfig).
	cut := r.highestFrontier() + int64(margin)
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, cut
	r.publishExcept(late, &loading)

	waitUntilOr(t, "the late replica's sibling passed the cut, the late one held or passed it", func() bool {
		if r.level("rc/lines/p0/r0") < 1 {
			return false
		}
		return r.cutHolds(late) > 0 || r.states()[late].ReconfigFrontier >= cut+int64(10*time.Millisecond)
	}, func() {
		sts := r.states()
		for _, id := range []string{"rc/lines/p0/r0", late} {
			st := sts[id]
			t.Logf("%s: %s level %d acked %d frontier %d (cut %d) holds %d: %s", id, st.State, st.ReconfigLevel, st.ReconfigAcked, st.ReconfigFrontier, cut, r.cutHolds(id), st.Message)
		}
	})
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	if r.cutHolds(late) > 0 {
		// A snapshot of the held source leaves the record it drew and
		// holds before to the copy: a copy would draw it again.
		var snap *TaskSnapshot
		for _, w := range r.c.workers {
			if w.rt.task(late) != nil {
				var err error
				if snap, err = w.rt.SnapshotTask(context.Background(), late, SnapshotOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if snap.SourceRecords != int64(snap.Seq) {
			t.Fatalf("snapshot of the held source: %d records drawn, %d emitted", snap.SourceRecords, snap.Seq)
		}
	}
	r.publish()
	r.finish(limit)
	if r.cutHolds(late) == 0 {
		t.Fatalf("the late replica never held for the cut %d", cut)
	}
}

// replicaRun is a reconfigRun of reconfigYAML with two replicas of every
// task, both sinks' outputs read.
type replicaRun struct {
	*reconfigRun
	replica1    []tuple.Tuple // sink replica 1's output (under mu)
	done, done1 <-chan struct{}
}

// startReplicaRun starts a replicaRun of limit lines per source
// partition and returns once output flows. Availability is strict: a
// source replica holding for a cut is no failure, the replicas
// downstream wait for it rather than going tentative. The sources go at
// a tenth of their rate (stream times, and so results, unchanged) so
// that a plan switches mid-stream: under the race detector at load ~30
// the 2 s stream had ended when the sink had its first 300 results; the
// test sets restSpeed once its plan switched.
func startReplicaRun(t *testing.T, limit int) *replicaRun {
	t.Helper()
	yaml := strings.Replace(fmt.Sprintf(reconfigYAML, 2000, limit), "name: rc\n", "name: rc\nreplicas: 2\navailability: {max_delay: strict}\n", 1)
	r := &replicaRun{reconfigRun: startReconfigRunReplicas(t, yaml, fsm.TrackingStatic, 2)}
	if err := r.pace.Set(0.1); err != nil {
		t.Fatal(err)
	}
	r.done1 = r.tailOf("rc/out/p0/r1", &r.replica1)
	r.done = r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	return r
}

// finish waits until every task has the markers of the run's (switched)
// plan, completes it, reads both sinks to their ends and checks that the
// plan switched mid-stream, nothing was lost, duplicated or mixed, and
// the two sink replicas' stable outputs are the same, tags included.
func (r *replicaRun) finish(limit int) {
	r.t.Helper()
	r.waitLevel(1)
	r.complete()
	<-r.done
	<-r.done1
	paths := r.check(limit, true)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		r.t.Fatalf("the upgrade did not happen mid-stream: %v", paths)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sameReplicaRows(r.t, r.out, r.replica1)
}

// cutHolds is how many times source task id held for a plan's cut.
func (r *reconfigRun) cutHolds(id string) uint64 { return r.stats(id).CutHolds }

// stats are the statistics of task id (zero if no worker runs it).
func (r *reconfigRun) stats(id string) TaskStats {
	for _, w := range r.c.workers {
		for _, st := range w.rt.Stats() {
			if st.TaskID == id {
				return st
			}
		}
	}
	return TaskStats{}
}

// TestReconfigSourceMovedBeforeTheCut moves a source replica after it
// acknowledged a live plan, ahead of its sibling, and held at the plan's
// lowest cut: the coordinator forgets the old copy's report with the new
// placement (fsm resetReconfig), so the cut comes from the frontiers
// the copies report now. The new copy reports its original's frontier
// (carried in the snapshot), so the cut goes above everything the old
// copy emitted, and both replicas switch at it: the two sinks' stable
// outputs are the same, version tags included. Before the snapshot
// carried it the new copy acknowledged with frontier 0, the cut fell at
// the sibling's frontier plus the margin, below records the old copy had
// emitted under the old epoch, and the sinks differed in their tags.
func TestReconfigSourceMovedBeforeTheCut(t *testing.T) {
	const (
		limit   = 4000
		margin  = 20 * time.Millisecond
		moved   = "rc/lines/p0/r0"
		sibling = "rc/lines/p0/r1"
	)
	r := startReplicaRun(t, limit)
	r.margin = margin
	before := r.rc
	before.Plans = slices.Clone(r.rc.Plans)
	r.appendPlan(2)
	// Every task but the one to move learns the plan: the sibling holds
	// at its floor while the other goes on, so that it acknowledges
	// (once it learns the plan) with a frontier well above the sibling's.
	r.publishExcept(moved, &before)
	waitUntil(t, "the sibling held at the plan's lowest cut", func() bool { return r.cutHolds(sibling) > 0 })
	ahead := r.stats(sibling).OutTuples + 100 // 50 ms of stream time, 2.5 margins
	waitUntil(t, "the source to move 100 records ahead of its held sibling", func() bool { return r.stats(moved).OutTuples >= ahead })
	r.publish()
	waitUntil(t, "the source to move held at its own floor", func() bool { return r.cutHolds(moved) > 0 })
	movedAt := r.states()[moved].ReconfigFrontier
	if siblingAt := r.states()[sibling].ReconfigFrontier; movedAt < siblingAt+int64(margin) {
		t.Fatalf("the source to move acknowledged at %d, its sibling at %d: not a margin apart", movedAt, siblingAt)
	}
	// Not halted (a generator source is not snapshotted halting): the old
	// copy stays held at its floor until the consumers switch.
	r.c.move(t, moved, r.c.workers[0], r.c.workers[2], false)
	r.waitAcked(1)
	// The coordinator's rule (fsm advanceReconfig) over the copies'
	// reports, the moved task's from its new copy only.
	cut := r.highestFrontier() + int64(margin)
	if cut <= movedAt+int64(margin)-1 {
		t.Errorf("cut %d below the old copy's floor %d: the new copy reported frontier %d", cut, movedAt+int64(margin), r.states()[moved].ReconfigFrontier)
	}
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, cut
	r.publish()
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.finish(limit)
}

// TestReconfigIngestSourceHoldsForTheCut: an ingest request whose record
// reaches the lowest cut a loading plan can get (the source's
// acknowledged frontier plus the margin) waits until the source learns
// the cut, and then goes through under the configuration the cut gives
// it. Without the hold the record went out under the old version while
// the plan loaded, though the cut the leader then set lay below it (a
// replica that knew the cut would have tagged it with the new one).
func TestReconfigIngestSourceHoldsForTheCut(t *testing.T) {
	r, addr, done, frontier, answered := startHeldIngest(t)
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, frontier+int64(r.margin)
	r.publish()
	a := <-answered
	if a.err != nil || a.resp.Accepted != 2 {
		t.Fatalf("request after the switch: %+v %v", a.resp, a.err)
	}
	r.waitLevel(1)
	r.complete()
	if _, err := ingestReqs(t, r.c, addr, &fedstreampb.IngestRequest{Query: "rc", Source: "events", Close: true}); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := r.checkIdlePaths([]string{"a", "b", "c", "d", "e"}); !slices.Equal(got, []string{"v1", "v1", "v1", "v2", "v2"}) {
		t.Fatalf("paths %v (the cut at 4s)", got)
	}
}

// startHeldIngest is startIdleIngest with a plan (a 1 s margin) every
// task acknowledged, the source at frontier 3 s (returned), and a request
// of users d and e at 4 and 5 s held in the source for the plan's cut
// (its floor at 4 s): answered brings the request's answer.
func startHeldIngest(t *testing.T) (r *reconfigRun, addr string, done <-chan struct{}, frontier int64, answered <-chan ingestAnswer) {
	t.Helper()
	r, addr, done = startIdleIngest(t)
	r.margin = time.Second
	r.commit(2)
	if frontier = r.highestFrontier(); frontier != int64(3*time.Second) {
		t.Fatalf("frontier %d, want the newest record's time 3s", frontier)
	}
	answered = r.heldIngest(addr, "rc/events/p0/r0", idleIngestReq(4, idleIngestRec(4, "d"), idleIngestRec(5, "e")))
	return r, addr, done, frontier, answered
}

type ingestAnswer struct {
	resp *fedstreampb.IngestResponse
	err  error
}

// heldIngest sends req to the ingest source task src at addr in the
// background and waits until src held for a plan's cut (failing the test
// if the request was answered first); the answer comes on the channel.
func (r *reconfigRun) heldIngest(addr, src string, req *fedstreampb.IngestRequest) <-chan ingestAnswer {
	r.t.Helper()
	conn, err := r.c.pool.Conn(addr)
	if err != nil {
		r.t.Fatal(err)
	}
	var tk *task
	for _, w := range r.c.workers {
		if w.addr == addr {
			tk = w.rt.task(src)
		}
	}
	if tk == nil {
		r.t.Fatalf("no task %s at %s", src, addr)
	}
	holds := tk.counters.cutHolds.Load()
	answered := make(chan ingestAnswer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		stream, err := fedstreampb.NewDataPlaneClient(conn).Ingest(ctx)
		if err == nil {
			err = stream.Send(req)
		}
		if err != nil {
			answered <- ingestAnswer{err: err}
			return
		}
		resp, err := stream.CloseAndRecv()
		answered <- ingestAnswer{resp, err}
	}()
	waitUntil(r.t, "the source held for the cut, or the request answered", func() bool { return tk.counters.cutHolds.Load() > holds || len(answered) > 0 })
	select {
	case a := <-answered:
		r.t.Fatalf("the request was answered while the plan loaded: %+v %v", a.resp, a.err)
	default:
	}
	return answered
}

// TestReconfigHeldIngestSourceMoved moves an ingest source while a
// request waits in it for a loading plan's cut (a tiny margin, a plan
// not yet switched): the move's snapshot, which needs the source's
// ingest lock, makes the held request give way (answered with
// ErrSourceMoved, none of its held lines taken), and the new copy,
// started from the snapshot, holds the resent lines at the same floor
// until it learns the cut. Before, the snapshot waited for the lock
// until the cut came, and the cut could wait for the moved copy's
// acknowledgement (the coordinator forgets the old copy's with the new
// placement): the move hung until the client or the fetch gave up.
func TestReconfigHeldIngestSourceMoved(t *testing.T) {
	const src = "rc/events/p0/r0"
	r, _, done, frontier, answered := startHeldIngest(t)
	req, rec := idleIngestReq, idleIngestRec
	from, to := r.c.workers[0], r.c.workers[1]
	r.c.move(t, src, from, to, true)
	waitUntil(t, "the held request answered", func() bool { return len(answered) > 0 })
	if a := <-answered; a.err == nil || !strings.Contains(a.err.Error(), "moved") {
		t.Fatalf("the held request, its source moved: %+v %v, want the source moved", a.resp, a.err)
	}
	var moved TaskState
	for _, st := range to.rt.States() {
		if st.TaskID == src {
			moved = st
		}
	}
	if moved.ReconfigAcked != 1 || moved.ReconfigFrontier != frontier {
		t.Fatalf("the new copy acknowledged %d with frontier %d, want 1 with its original's %d", moved.ReconfigAcked, moved.ReconfigFrontier, frontier)
	}
	answered = r.heldIngest(to.addr, src, req(4, rec(4, "d"), rec(5, "e")))
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, frontier+int64(r.margin)
	r.publish()
	if a := <-answered; a.err != nil || a.resp.Accepted != 2 {
		t.Fatalf("request to the new copy after the switch: %+v %v", a.resp, a.err)
	}
	r.waitLevel(1)
	r.complete()
	if _, err := ingestReqs(t, r.c, to.addr, &fedstreampb.IngestRequest{Query: "rc", Source: "events", Close: true}); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := r.checkIdlePaths([]string{"a", "b", "c", "d", "e"}); !slices.Equal(got, []string{"v1", "v1", "v1", "v2", "v2"}) {
		t.Fatalf("paths %v (the cut at 4s)", got)
	}
}

// TestReconfigHeldSourcesStop: a plan that cannot switch (here one task,
// the sink, never acknowledges it: a worker lost, a version it cannot
// build) holds every kind of source at the plan's lowest cut, and the
// query stopping ends each hold: the generator's and the kafka source's
// goroutines end, an ingest request held is answered with an error, and
// every worker's Apply returns. Checked to fail (Apply never returned)
// with holdUntil not watching its context.
func TestReconfigHeldSourcesStop(t *testing.T) {
	const sink = "rc/out/p0/r0"
	withhold := func(r *reconfigRun) {
		r.t.Helper()
		before := r.rc
		before.Plans = slices.Clone(r.rc.Plans)
		r.appendPlan(2)
		r.publishExcept(sink, &before)
	}
	t.Run("generator", func(t *testing.T) {
		r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, 3000), fsm.TrackingStatic)
		waitUntil(t, "the sources producing", func() bool { return r.stats("rc/lines/p0/r0").OutTuples > 100 })
		r.margin = 20 * time.Millisecond
		withhold(r)
		waitUntil(t, "both sources held for the cut", func() bool {
			return r.cutHolds("rc/lines/p0/r0") > 0 && r.cutHolds("rc/lines/p1/r0") > 0
		})
		r.stopAll()
	})
	t.Run("kafka", func(t *testing.T) {
		const src = "rc/events/p0/r0"
		r, broker, value, _ := startIdleKafka(t)
		r.margin = time.Second
		withhold(r)
		waitUntil(t, "the source acknowledged", func() bool { return r.states()[src].ReconfigAcked == 1 })
		if err := kafkatest.Produce(broker, "events", 0, [][]byte{value(4, "d"), value(5, "e")}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the source held for the cut", func() bool { return r.cutHolds(src) > 0 })
		r.stopAll()
	})
	t.Run("ingest", func(t *testing.T) {
		const src = "rc/events/p0/r0"
		r, addr, _ := startIdleIngest(t)
		r.margin = time.Second
		withhold(r)
		waitUntil(t, "the source acknowledged", func() bool { return r.states()[src].ReconfigAcked == 1 })
		answered := r.heldIngest(addr, src, idleIngestReq(4, idleIngestRec(4, "d"), idleIngestRec(5, "e")))
		r.stopAll()
		waitUntil(t, "the held request answered", func() bool { return len(answered) > 0 })
		// Answered by the stop, not by the client's own deadline.
		if a := <-answered; a.err == nil || status.Code(a.err) == codes.DeadlineExceeded {
			t.Fatalf("the held request, its task stopped: %+v %v", a.resp, a.err)
		}
	})
}

// stopAll stops every task of the run on every worker (the query
// stopped), failing the test if a worker's Apply does not return.
func (r *reconfigRun) stopAll() {
	r.t.Helper()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for _, w := range r.c.workers {
			w.rt.Apply(context.Background(), nil)
		}
	}()
	waitUntil(r.t, "every task stopped", func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	})
	for _, w := range r.c.workers {
		if sts := w.rt.States(); len(sts) != 0 {
			r.t.Fatalf("tasks left after the stop: %+v", sts)
		}
	}
}

// TestReconfigKafkaSourceHoldsForTheCut is the same for a kafka source:
// records at and past the floor that arrive while the plan loads wait in
// the source (its boundary before them too) until it learns the cut.
func TestReconfigKafkaSourceHoldsForTheCut(t *testing.T) {
	const src = "rc/events/p0/r0"
	r, broker, value, dataAtSink := startIdleKafka(t)
	r.margin = time.Second
	r.commit(2)
	frontier := r.highestFrontier()
	if frontier != kafkaEpoch+int64(3*time.Second) {
		t.Fatalf("frontier %d, want the newest record's time (3 s after %d)", frontier, kafkaEpoch)
	}
	if err := kafkatest.Produce(broker, "events", 0, [][]byte{value(4, "d"), value(5, "e")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the source held for the cut, or the records reached the sink", func() bool { return r.cutHolds(src) > 0 || dataAtSink(5)() })
	if r.cutHolds(src) == 0 {
		t.Fatal("the records went out while the plan loaded")
	}
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, frontier+int64(r.margin)
	r.publish()
	waitUntil(t, "the later records at the sink", dataAtSink(5))
	if got := r.checkIdlePaths([]string{"a", "b", "c", "d", "e"}); !slices.Equal(got, []string{"v1", "v1", "v1", "v2", "v2"}) {
		t.Fatalf("paths %v (the cut 4 s after %d)", got, kafkaEpoch)
	}
}

// highestFrontier is the highest frontier the tasks report: the
// coordinator's cut is that plus the plan's margin.
func (r *reconfigRun) highestFrontier() int64 {
	frontier := int64(math.MinInt64)
	for _, st := range r.states() {
		frontier = max(frontier, st.ReconfigFrontier)
	}
	return frontier
}
