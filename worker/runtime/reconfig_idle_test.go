package runtime

import (
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
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// idleSourceYAML: a push source (%s: its definition) with a map fused into
// it that labels each tuple with its version ('v1'), and a sink.
const idleSourceYAML = `name: rc
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
%s
operators:
  - {name: label, type: map, input: events, fields: {user: user, amount: amount, path: "'v1'"}}
sinks:
  - {name: out, input: label}
`

// startIdleRun runs yaml's tasks on one worker, with `label` the operator
// plans change; a second worker runs nothing (a task may move there).
func startIdleRun(t *testing.T, yaml string) *reconfigRun {
	t.Helper()
	q, err := queryspec.Parse("rc.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterOpts(t, 2, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: 5 * time.Millisecond})
	t.Cleanup(func() { c.close(t) })
	r := &reconfigRun{t: t, c: c, yaml: yaml, rc: fsm.QueryReconfig{Tracking: fsm.TrackingStatic}, plan: plan, tasks: len(c.specs[c.workers[0]]),
		version: func(v int) string { return strings.ReplaceAll(yaml, "'v1'", fmt.Sprintf("'v%d'", v)) }, changed: []string{"label"}}
	c.apply()
	return r
}

// checkIdlePaths checks that the sink's data tuples are the users want in
// order, each labelled by the version its tag names, and returns the
// labels.
func (r *reconfigRun) checkIdlePaths(want []string) []string {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var users, paths []string
	for _, tp := range r.out {
		if !tp.Type.IsData() {
			continue
		}
		users, paths = append(users, tp.Values[0].S), append(paths, tp.Values[2].S)
		if p := tp.Values[2].S; p != fmt.Sprintf("v%d", tp.Version+1) {
			r.t.Fatalf("tuple %s: path %s but version tag %d", tp.Values[0].S, p, tp.Version)
		}
	}
	if !slices.Equal(users, want) {
		r.t.Fatalf("sink got %v, want %v", users, want)
	}
	return paths
}

// startIdleIngest starts idleSourceYAML with an ingest source, tails its
// sink and ingests users a, b and c at 1, 2 and 3 s: it returns once
// they reached the sink, with the worker's address and the tail's end.
func startIdleIngest(t *testing.T) (r *reconfigRun, addr string, done <-chan struct{}) {
	t.Helper()
	r = startIdleRun(t, fmt.Sprintf(idleSourceYAML, "    ingest: true"))
	addr = r.c.workers[0].addr
	done = r.tail()
	if _, err := ingestReqs(t, r.c, addr, idleIngestReq(1, idleIngestRec(1, "a"), idleIngestRec(2, "b"), idleIngestRec(3, "c"))); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the first records at the sink", func() bool { return r.received() == 3 })
	return r, addr, done
}

// idleIngestReq is an ingest request of records recs into
// startIdleIngest's source, numbered from first.
func idleIngestReq(first uint64, recs ...string) *fedstreampb.IngestRequest {
	return &fedstreampb.IngestRequest{Query: "rc", Source: "events", FirstLine: first, Lines: []byte(strings.Join(recs, "\n") + "\n")}
}

// idleIngestRec is a record of user at sec seconds.
func idleIngestRec(sec int, user string) string {
	return fmt.Sprintf(`{"time": %d, "user": %q, "amount": 1}`, int64(sec)*int64(time.Second), user)
}

// TestReconfigIdleIngestSourceSwitches: an ingest source that receives
// nothing while a plan is committed and switched still acknowledges the
// plan and emits its marker (before, it did so only with its next
// request: an idle source held the plan in loading). The cut is an hour
// of stream time ahead, yet the records that come after the switch are
// processed by the new version: the source's marker was sent.
func TestReconfigIdleIngestSourceSwitches(t *testing.T) {
	r, addr, done := startIdleIngest(t)
	req, rec := idleIngestReq, idleIngestRec
	r.commit(2)            // waits for every task's acknowledgement
	r.switchAll(time.Hour) // far beyond anything the source will produce
	r.waitLevel(1)         // every task has the source's marker
	src := r.c.workers[0].rt.task("rc/events/p0/r0")
	src.ingest.mu.Lock() // the ingest source's producer lock
	v := src.rc.vers[0].Versions()
	src.ingest.mu.Unlock()
	if !slices.Equal(v, []int{2}) {
		t.Fatalf("the source runs versions %v of label after its marker, want [2]", v)
	}
	resp, err := ingestReqs(t, r.c, addr, req(4, rec(4, "d"), rec(5, "e")), &fedstreampb.IngestRequest{Close: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Accepted != 2 || len(resp.Errors) != 0 {
		t.Fatalf("response %+v", resp)
	}
	<-done
	if got := r.checkIdlePaths([]string{"a", "b", "c", "d", "e"}); !slices.Equal(got, []string{"v1", "v1", "v1", "v2", "v2"}) {
		t.Fatalf("paths %v", got)
	}
}

// startIdleKafka starts idleSourceYAML with a kafka source on a test
// broker, produces users a, b and c at 1, 2 and 3 s (value: a record at
// sec seconds after kafkaEpoch) and returns once they reached the sink.
// dataAtSink(n) reads the sink's stream into r.out and reports whether
// it holds n data tuples (a kafka source does not end).
func startIdleKafka(t *testing.T) (r *reconfigRun, broker string, value func(sec int64, user string) []byte, dataAtSink func(n int) func() bool) {
	t.Helper()
	broker = kafkatest.Start(t, map[string]int32{"events": 1})
	r = startIdleRun(t, fmt.Sprintf(idleSourceYAML, fmt.Sprintf("    kafka: {brokers: [%q], topic: events, partitions: 1}", broker)))
	value = func(sec int64, user string) []byte {
		return fmt.Appendf(nil, `{"time": %d, "user": %q, "amount": 1}`, kafkaEpoch+sec*int64(time.Second), user)
	}
	if err := kafkatest.Produce(broker, "events", 0, [][]byte{value(1, "a"), value(2, "b"), value(3, "c")}); err != nil {
		t.Fatal(err)
	}
	sink := r.c.workers[0].rt.task("rc/out/p0/r0")
	dataAtSink = func(n int) func() bool {
		return func() bool {
			last := sink.outs[0].buf.Stats().LastID
			if last == 0 {
				return false
			}
			ts := r.c.readStream(t, r.c.workers[0].addr, "rc/out/p0/r0", 0, last)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.out, r.n = ts, 0
			for _, tp := range ts {
				if tp.Type.IsData() {
					r.n++
				}
			}
			return r.n == n
		}
	}
	waitUntil(t, "the first records at the sink", dataAtSink(3))
	return r, broker, value, dataAtSink
}

// TestReconfigIdleKafkaSourceSwitches is the same for a kafka source whose
// partition has no new record during the update.
func TestReconfigIdleKafkaSourceSwitches(t *testing.T) {
	r, broker, value, dataAtSink := startIdleKafka(t)
	r.commit(2)
	r.switchAll(time.Hour)
	r.waitLevel(1)
	if err := kafkatest.Produce(broker, "events", 0, [][]byte{value(4, "d"), value(5, "e")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the later records at the sink", dataAtSink(5))
	if got := r.checkIdlePaths([]string{"a", "b", "c", "d", "e"}); !slices.Equal(got, []string{"v1", "v1", "v1", "v2", "v2"}) {
		t.Fatalf("paths %v", got)
	}
}

// TestReconfigUpgradeDuringDCAAFailure upgrades a and b (reconfigYAML,
// two replicas, availability within 200ms) while b's replica 0 has lost
// every replica of source partition 1 (its links to their worker held
// from before the plan until after the switch): it releases tentative
// results meanwhile, without partition 1's marker, so it keeps the old
// version. After the heal it corrects itself and gets the marker. The
// stable output of sink replica 0 (read through the failure) holds every
// generated line once, each tuple with a consistent version path, and
// equals replica 1's (which no failure touched), tags included.
func TestReconfigUpgradeDuringDCAAFailure(t *testing.T) {
	// Twelve seconds of input at the generators' rate, so that the
	// failure and the switch happen well within it on a loaded machine
	// (the rest runs faster once the failure is healed): with three
	// seconds, at load 50-70 the sources ended before the link was held
	// (b's replica 0 had all its input and never went tentative), or
	// before the plan switched (every result v1).
	const limit = 24000
	yaml := strings.Replace(fmt.Sprintf(reconfigYAML, 2000, limit), "name: rc\n", "name: rc\nreplicas: 2\navailability: {max_delay: 200ms}\n", 1)
	q, err := queryspec.Parse("rc.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	// Source partition 0 on worker 0, partition 1 on worker 3 (both
	// replicas each), b's replica 0 on worker 1 (its links can be held),
	// replica 1 on worker 2, the sinks on worker 4.
	opts, pace := pacedOpts(t, dcaaOpts)
	g := newFaultRig(t, q, 5, []int{1}, opts, func(node string, p, rep int) int {
		switch {
		case node == "lines":
			return 3 * p
		case node == "b":
			return 1 + rep
		}
		return 4
	})
	r := &reconfigRun{t: t, c: g.c, yaml: yaml, rc: fsm.QueryReconfig{Tracking: fsm.TrackingStatic}, plan: plan,
		version: func(v int) string { return versionYAML(yaml, v) }, changed: []string{"a", "b"}}
	for _, specs := range g.c.specs {
		r.tasks += len(specs)
	}
	g.c.apply()
	var replica1 []tuple.Tuple
	done1 := r.tailOf("rc/out/p0/r1", &replica1)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	const b0 = "rc/b/p0/r0"
	g.cut(1, dataplane.Hold, 3)
	waitUntil(t, "b's replica 0 releasing tentative results", func() bool { return g.taskState(b0).Tentative })
	// At load ~60 the stream ended before the plan switched ("the
	// upgrade did not happen mid-stream: map[v1:48000]"): the sources go
	// at a twentieth of their rate until the failure healed (stream
	// times, and so results, unchanged).
	if err := pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	// The plan reaches b's replica 0 while it is busy (its processing
	// token held, as by a release or a checkpoint): it installs the plan
	// once the token is free. Under load this happened by chance, and
	// the replica never acknowledged (its machine did not look for a
	// pending plan).
	busy := g.task(b0)
	if err := busy.lockProc(t.Context()); err != nil {
		t.Fatal(err)
	}
	// So does sink replica 0 (a pass-through sink, no machine): from
	// then on it reads only b's replica 0's tentative results, which
	// carry no boundary, and its sources end; under load it once was
	// busy appending when the plan came and never installed it (it
	// looked for a pending plan only when a batch with a boundary
	// came), so the plan never switched.
	sink := g.task("rc/out/p0/r0")
	if err := sink.lockProc(t.Context()); err != nil {
		t.Fatal(err)
	}
	epoch := r.addPlan(2).Epoch
	busy.unlockProc()
	sink.unlockProc()
	r.waitAcked(epoch)
	r.switchAll(100 * time.Millisecond)
	waitUntil(t, "every task but b's replica 0 at level 1", func() bool {
		for id, st := range r.states() {
			if id != b0 && id != "rc/out/p0/r0" && st.ReconfigLevel < 1 {
				return false
			}
		}
		return true
	})
	if st := g.taskState(b0); st.ReconfigLevel != 0 || !st.Tentative {
		t.Fatalf("b's replica 0 at level %d (tentative %v) without partition 1's marker", st.ReconfigLevel, st.Tentative)
	}
	if v := r.versionsOf(b0, 0); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("b's replica 0 removed its old version while an upstream was cut off: %v", v)
	}
	g.faults[1].HealAll()
	g.stableAgain(t, b0)
	if err := pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.waitLevel(1)
	r.complete()
	<-done
	<-done1
	got := viewOf(r.out)
	if got.tentative == 0 || got.undos == 0 {
		t.Fatalf("sink replica 0 saw %d tentative tuples and %d UNDOs: the failure did not reach it", got.tentative, got.undos)
	}
	paths := r.check(limit, true)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("the upgrade did not happen mid-stream: %v", paths)
	}
	want := viewOf(replica1).stable
	if len(got.stable) != len(want) {
		t.Fatalf("sink replica 0: %d stable tuples, replica 1 %d", len(got.stable), len(want))
	}
	for i := range want {
		a, b := got.stable[i], want[i]
		if a.Type != b.Type || a.STime != b.STime || a.Version != b.Version || !slices.Equal(a.Values, b.Values) {
			t.Fatalf("stable tuple %d: replica 0 %+v, replica 1 %+v", i, a, b)
		}
	}
}

// windowV2 is statefulYAML with per_window's tumbling window doubled (a
// new state shape) and b labelling its rows -2 instead of -1.
func windowV2(yaml string) string {
	s := strings.Replace(yaml, "window: {size: 200ms}", "window: {size: 400ms}", 1)
	return strings.Replace(s, `extra: "0 - 1"`, `extra: "0 - 2"`, 1)
}

// TestReconfigAggregateWindowChanged upgrades an aggregate to another
// window size mid-stream (and b after it): the new version runs a state
// of its own from the switch, which the workers align to a boundary of
// both windows, while the old version's windows finish with the tuples
// before it. Every row is exact (the reference splits the generators'
// tuples at the aligned cut: 200ms windows before, 400ms after), comes
// from one version with the tag naming it (b's label agrees), and none
// is lost or duplicated; once every marker arrived the old stage is gone.
func TestReconfigAggregateWindowChanged(t *testing.T) {
	const limit = 6000
	yaml := fmt.Sprintf(statefulYAML, limit)
	r := startReconfigRun(t, yaml, fsm.TrackingStatic)
	r.version = func(v int) string { return windowV2(yaml) }
	r.changed = []string{"per_window", "b"}
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 2 })
	r.commit(2)
	r.switchAll(50 * time.Millisecond)
	r.waitLevel(1)
	waitUntil(t, "the old window's stage dropped", func() bool {
		return slices.Equal(r.versionsOf("rc/per_window/p0/r0", 0), []int{2})
	})
	r.complete()
	<-done

	const small, large = int64(200 * time.Millisecond), int64(400 * time.Millisecond)
	cut := operator.AlignCut(r.rc.Plans[0].Cut, []int64{small, large})
	if cut%large != 0 || cut < r.rc.Plans[0].Cut {
		t.Fatalf("aligned cut %d from %d", cut, r.rc.Plans[0].Cut)
	}
	type key struct{ end, g int64 }
	type ref struct{ cnt, total int64 }
	want := map[key]*ref{}
	for p := range 2 {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 5, Limit: limit, Rate: 2000}, p)
		if err != nil {
			t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			n := int64(len(tp.Values[0].S))
			size := small
			if tp.STime >= cut {
				size = large
			}
			k := key{(tp.STime/size + 1) * size, n % 3}
			if want[k] == nil {
				want[k] = &ref{}
			}
			want[k].cnt++
			want[k].total += n
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	got := map[key]bool{}
	tags := map[uint64]int{}
	for _, tp := range r.out {
		if tp.Type != tuple.Stable {
			continue
		}
		g, cnt, total, extra, end := tp.Values[0].I, tp.Values[1].I, tp.Values[2].I, tp.Values[3].I, tp.Values[4].I
		k := key{end, g}
		w := want[k]
		if w == nil || got[k] {
			t.Fatalf("row %+v (tag %d): not in the reference, or emitted twice", k, tp.Version)
		}
		got[k] = true
		tags[tp.Version]++
		if cnt != w.cnt || total != w.total {
			t.Fatalf("row %+v (tag %d): cnt %d total %d, want %d %d", k, tp.Version, cnt, total, w.cnt, w.total)
		}
		if wantTag := map[bool]uint64{true: 0, false: 1}[end <= cut]; tp.Version != wantTag || extra != -1-int64(wantTag) {
			t.Fatalf("row %+v: tag %d, label %d; the window ends at %d, the cut is %d", k, tp.Version, extra, end, cut)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: lost rows", len(got), len(want))
	}
	if tags[0] == 0 || tags[1] == 0 {
		t.Fatalf("rows by tag %v: the upgrade did not happen mid-stream", tags)
	}
}

// joinYAML: two generated streams keyed by their lines' length mod 7,
// joined in 100ms windows with a predicate, and a map after the join
// (fused into its task) labelling each pair with its version.
const joinYAML = `name: rc
sources:
  - {name: ls, generator: {kind: words, rate: 500, seed: 5, limit: %[1]d}}
  - {name: rs, generator: {kind: words, rate: 500, seed: 6, limit: %[1]d}}
operators:
  - {name: lm, type: map, input: ls, fields: {line: line, k: "len(line) %% 7", n: "len(line)"}}
  - {name: rm, type: map, input: rs, fields: {line: line, k: "len(line) %% 7", m: "len(line)"}}
  - {name: both, type: join, left: lm, right: rm, on: [k], window: {size: 100ms}, where: "n + m > 60"}
  - {name: label, type: map, input: both, fields: {l: line, r: right_line, path: "'v1'"}}
sinks:
  - {name: out, input: label}
`

// joinV2 is joinYAML with the join's predicate written otherwise (the same
// pairs) and the label at v2.
func joinV2(yaml string) string {
	s := strings.Replace(yaml, `where: "n + m > 60"`, `where: "m > 60 - n"`, 1)
	return strings.Replace(s, "'v1'", "'v2'", 1)
}

// TestReconfigJoinUpgradedMidStream upgrades a join's predicate (and the
// map after it) while tuples flow: its versions share its buffered
// tuples, so the windows open at the switch keep both sides. The new
// predicate selects the same pairs, so the output is exactly the
// reference's (every pair once, computed from the generators); each
// pair's label names the version its tag selects, both versions produced
// pairs, and the old version is gone once the markers arrived.
func TestReconfigJoinUpgradedMidStream(t *testing.T) {
	const limit = 1500
	yaml := fmt.Sprintf(joinYAML, limit)
	r := startReconfigRun(t, yaml, fsm.TrackingStatic)
	r.version = func(v int) string { return joinV2(yaml) }
	r.changed = []string{"both", "label"}
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 200 })
	// At load ~60 the 3 s stream ended before the plan loaded: the join
	// ran version 2 only. The sources go at a twentieth of their rate
	// until the plan switched (stream times, and so results, unchanged).
	if err := r.pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	r.commit(2)
	if v := r.versionsOf("rc/both/p0/r0", 0); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("the join runs versions %v while the plan loads, want [1 2]", v)
	}
	r.switchAll(50 * time.Millisecond)
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.waitLevel(1)
	if v := r.versionsOf("rc/both/p0/r0", 0); !slices.Equal(v, []int{2}) {
		t.Fatalf("the join runs versions %v after the markers, want [2]", v)
	}
	r.complete()
	<-done

	type rec struct {
		stime int64
		line  string
	}
	read := func(seed int64) []rec {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: seed, Limit: limit, Rate: 500}, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []rec
		var tp tuple.Tuple
		for gen.Next(&tp) {
			out = append(out, rec{tp.STime, tp.Values[0].S})
		}
		return out
	}
	const size = int64(100 * time.Millisecond)
	type wk struct{ w, k int64 }
	rights := map[wk][]string{}
	for _, x := range read(6) {
		k := wk{floorDiv(x.stime, size), int64(len(x.line) % 7)}
		rights[k] = append(rights[k], x.line)
	}
	var want []string
	for _, x := range read(5) {
		for _, rl := range rights[wk{floorDiv(x.stime, size), int64(len(x.line) % 7)}] {
			if len(x.line)+len(rl) > 60 {
				want = append(want, x.line+"|"+rl)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var got []string
	paths := map[string]int{}
	for _, tp := range r.out {
		if tp.Type != tuple.Stable {
			continue
		}
		got = append(got, tp.Values[0].S+"|"+tp.Values[1].S)
		path := tp.Values[2].S
		paths[path]++
		if path != fmt.Sprintf("v%d", tp.Version+1) {
			t.Fatalf("pair %d: label %s but tag %d", tp.ID, path, tp.Version)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("%d pairs, the reference %d: lost, extra or duplicated pairs", len(got), len(want))
	}
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("pairs by version %v: the upgrade did not happen mid-stream", paths)
	}
}
