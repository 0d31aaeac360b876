package runtime

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/kafka/kafkatest"
	"github.com/fedstream/fedstream/worker/tuple"
)

// placeOneAgain stops the copy of task id on worker from (as if only it
// were lost) and places its next generation on worker next without a
// snapshot, with kept (what the leader kept of the lost copy) and the
// run's reconfiguration in its assignment. Only next learns of it: the
// other workers' tasks still look for the lost copy until tellAll.
func (r *reconfigRun) placeOneAgain(from *worker, id string, next *worker, kept *fsm.ReconfigKept) (tellAll func()) {
	r.t.Helper()
	c := r.c
	var spec TaskSpec
	c.specs[from] = slices.DeleteFunc(c.specs[from], func(s TaskSpec) bool {
		if s.TaskID == id {
			spec = s
			return true
		}
		return false
	})
	from.rt.Apply(context.Background(), c.specs[from])
	var pls []Placement
	for _, pl := range spec.Placements {
		if pl.TaskID == id {
			pl.WorkerAddr, pl.Generation = next.addr, 2
		}
		pls = append(pls, pl)
	}
	rc := r.rc
	rc.Plans = slices.Clone(r.rc.Plans)
	spec.Generation, spec.Placements, spec.ReconfigKept, spec.Reconfig = 2, pls, kept, &rc
	c.specs[next] = append(c.specs[next], spec)
	next.rt.Apply(context.Background(), c.specs[next])
	return func() {
		for _, w := range c.workers {
			for i := range c.specs[w] {
				c.specs[w][i].Placements = pls
			}
		}
		c.apply()
	}
}

// readOutput reads the output stream of source task id (on addr) to
// consumer fragment `consumer` (partition 0) without acknowledging,
// from its start up to id upTo.
func (r *reconfigRun) readOutput(addr, id, consumer string, upTo uint64) []tuple.Tuple {
	r.t.Helper()
	conn, err := r.c.pool.Conn(addr)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "rc", TaskId: id, Consumer: consumer}, "", true, 0)
	var out []tuple.Tuple
	for {
		err := sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			for _, tp := range b.Tuples {
				tp.Values = slices.Clone(tp.Values)
				tuple.DetachStrings(tp.Values)
				out = append(out, tp)
				if tp.ID >= upTo {
					return dataplane.ErrStopSubscription
				}
			}
			return nil
		})
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			r.t.Fatalf("read %s: %v (read %d tuples)", id, err, len(out))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sameStream reports the first difference between two streams (id,
// type, stream time, tag and first value of each tuple), "" if none.
func sameStream(got, want []tuple.Tuple) string {
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) {
			return fmt.Sprintf("%d tuples, want %d", len(got), len(want))
		}
		g, w := got[i], want[i]
		gv, wv := "", ""
		if len(g.Values) > 0 {
			gv = fmt.Sprint(g.Values[0])
		}
		if len(w.Values) > 0 {
			wv = fmt.Sprint(w.Values[0])
		}
		if g.ID != w.ID || g.Type != w.Type || g.STime != w.STime || g.Version != w.Version || gv != wv {
			return fmt.Sprintf("tuple %d: id %d %v at %d tag %d %q, want id %d %v at %d tag %d %q", i, g.ID, g.Type, g.STime, g.Version, gv, w.ID, w.Type, w.STime, w.Version, wv)
		}
	}
	return ""
}

// TestReconfigKafkaSourcePlacedAgainReplaysItsSwitch: a kafka source
// that received nothing while a plan switched sent its marker early (an
// idle source's switch: a boundary at the newest stream time it had
// sent, an hour below the cut), then produced records under the new
// epoch. Its copy is lost and placed again without a snapshot, with
// what the leader kept of it: it reads its partition again from the
// start and must produce the lost copy's stream, the same tuples with
// the same ids and tags, since its consumer resumes by id after what it
// took; and what follows goes on under the new epoch.
func TestReconfigKafkaSourcePlacedAgainReplaysItsSwitch(t *testing.T) {
	const src = "rc/events/p0/r0"
	r, broker, value, dataAtSink := startIdleKafka(t)
	l := &keptLeader{}
	r.commit(2)
	r.switchAll(time.Hour)
	r.waitLevel(1)
	if err := kafkatest.Produce(broker, "events", 0, [][]byte{value(4, "d"), value(5, "e")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the records after the switch at the sink", dataAtSink(5))
	r.keepReports(l)
	kept := l.kept[src]
	if kept == nil || len(kept.Switches) != 1 {
		t.Fatalf("kept %+v, want the source's switch point", kept)
	}
	// The sink passes the source's stream on as it is, ids included.
	r.mu.Lock()
	lost := slices.Clone(r.out)
	r.mu.Unlock()
	if n := len(lost); n == 0 || lost[n-1].ID != uint64(n) {
		t.Fatalf("the sink's stream is not the source's: %d tuples, the last with id %d", n, lost[n-1].ID)
	}

	w0, w1 := r.c.workers[0], r.c.workers[1]
	tellAll := r.placeOneAgain(w0, src, w1, kept)
	// It replays what the lost copy read (5 records); what it appended by
	// then is read without acknowledging it.
	waitUntil(t, "the copy placed again replayed the partition", func() bool { return r.statsOn(w1, src).OutTuples >= 5 })
	upTo := min(lost[len(lost)-1].ID, w1.rt.task(src).outs[0].buf.Stats().LastID)
	replay := r.readOutput(w1.addr, src, "out", upTo)
	if d := sameStream(replay, lost); d != "" {
		t.Fatalf("the copy placed again does not replay the lost copy's stream: %s", d)
	}
	tellAll()
	if err := kafkatest.Produce(broker, "events", 0, [][]byte{value(6, "f")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the record after the loss at the sink", dataAtSink(6))
	if got := r.checkIdlePaths([]string{"a", "b", "c", "d", "e", "f"}); !slices.Equal(got, []string{"v1", "v1", "v1", "v2", "v2", "v2"}) {
		t.Fatalf("paths %v", got)
	}
}

// TestReconfigIngestSourcePlacedAgainGoesOnUnderItsSwitch: an ingest
// source that received nothing while a plan switched sent its marker
// early, and tagged what came after it with the new epoch. Its copy is
// lost and placed again without a snapshot, with what the leader kept of
// it: an ingest source does not replay (its producers resend only what
// it did not acknowledge), so everything the new copy produces comes
// after the lost copy's marker in its consumers' streams, and is tagged
// with the new epoch, a record behind the lost copy's marker (late for
// it, not for the new copy, which has seen nothing) included. The new
// copy's worker ticks once an hour, so that it does not switch on its own
// while idle (which would only hide the rule behind a race with the first
// request). Before, the new copy tagged that record by the switch point's
// stream time, with the old epoch.
func TestReconfigIngestSourcePlacedAgainGoesOnUnderItsSwitch(t *testing.T) {
	const src = "rc/events/p0/r0"
	yaml := fmt.Sprintf(idleSourceYAML, "    ingest: true")
	q, err := queryspec.Parse("rc.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterEach(t, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: 5 * time.Millisecond}, Options{BoundaryInterval: time.Hour})
	t.Cleanup(func() { c.close(t) })
	r := &reconfigRun{t: t, c: c, yaml: yaml, rc: fsm.QueryReconfig{Tracking: fsm.TrackingStatic}, plan: plan, tasks: len(c.specs[c.workers[0]]),
		version: func(v int) string { return strings.ReplaceAll(yaml, "'v1'", fmt.Sprintf("'v%d'", v)) }, changed: []string{"label"}}
	c.apply()
	w0, w1 := c.workers[0], c.workers[1]
	r.tail()
	req, rec := idleIngestReq, idleIngestRec
	if _, err := ingestReqs(t, c, w0.addr, req(1, rec(1, "a"), rec(2, "b"), rec(3, "c"))); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the first records at the sink", func() bool { return r.received() == 3 })
	l := &keptLeader{}
	r.commit(2)
	r.switchAll(time.Hour)
	r.waitLevel(1)
	if _, err := ingestReqs(t, c, w0.addr, req(4, rec(4, "d"))); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the record after the switch at the sink", func() bool { return r.received() == 4 })
	r.keepReports(l)
	kept := l.kept[src]
	if kept == nil || len(kept.Switches) != 1 || kept.Switches[0].At != 3*int64(time.Second) {
		t.Fatalf("kept %+v, want the source's early marker at 3 s", kept)
	}

	r.placeOneAgain(w0, src, w1, kept)
	resp, err := ingestReqs(t, c, w1.addr, req(5, rec(2, "g"), rec(6, "f")))
	if err != nil || resp.Accepted != 2 {
		t.Fatalf("ingest into the copy placed again: %+v %v", resp, err)
	}
	waitUntil(t, "the copy placed again produced both", func() bool { return r.statsOn(w1, src).OutTuples >= 2 })
	var users []string
	for _, tp := range r.readOutput(w1.addr, src, "out", w1.rt.task(src).outs[0].buf.Stats().LastID) {
		if !tp.Type.IsData() {
			continue
		}
		users = append(users, tp.Values[0].S)
		if tp.Version != 1 || tp.Values[2].S != "v2" {
			t.Fatalf("record %s of the copy placed again: tag %d path %s, want the new epoch (1, v2)", tp.Values[0].S, tp.Version, tp.Values[2].S)
		}
	}
	if !slices.Equal(users, []string{"g", "f"}) {
		t.Fatalf("the copy placed again produced %v", users)
	}
}

// TestEarlyLevelAfterItsOwnIdleSwitch: a source that switched early
// (idleSwitch: its marker at the newest stream time it had sent, its
// last boundary then) records that marker as its switch point (since
// session 19), and its snapshot must still carry its level
// (TaskSnapshot.SourceLevel): a copy started from it could not tell the
// switch from that boundary. With the switch point read as "from its
// stream time on" the boundary counted as switched by stream time, and
// the snapshot carried no level: a moved ingest source went on under the
// old epoch until the cut.
func TestEarlyLevelAfterItsOwnIdleSwitch(t *testing.T) {
	rc := &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{{Epoch: 1, Phase: fsm.ReconfigSwitched, Cut: 1000}}}
	r := &reconfigState{cur: rc, cuts: []epochCut{{1, 1000}}, on: true}
	r.level = 1 // idleSwitch raised it
	r.noteSwitch(1, 500)
	if got := r.earlyLevel(500); got != 1 {
		t.Fatalf("a snapshot at the early marker carries level %d, want 1", got)
	}
	if got := r.earlyLevel(1000); got != 0 {
		t.Fatalf("a snapshot at the cut carries level %d, want 0 (the boundary says it)", got)
	}
}
