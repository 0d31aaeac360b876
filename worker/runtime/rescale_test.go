package runtime

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/slots"
)

// rescaler plays the coordinator's part in a rescale of the "counts"
// fragment of a cluster's query: the three phases of fsm.SlotMapNext,
// with the tasks of added partitions placed on the workers in turn.
type rescaler struct {
	c          *cluster
	frag       string
	partitions int
	epoch      uint64
	owner      []int32
	// reader is the fragment reading frag ("" : out); starts, when not
	// nil, is what the finish records of a source's partitions.
	reader string
	starts []int64
	// down, when set, is the keyed fragment reading frag (whose tasks
	// must pass the cut) in place of the sink "out"; every task of the
	// query still takes part, as for any keyed fragment.
	down string
	// place, when not nil, picks the worker (index) of an added
	// partition's replica; else they go to the workers in turn.
	place func(p, r int) int
	// upstream, with reader, is the fragment routing to a keyed frag:
	// its tasks take part too.
	upstream string
	// prepared, when not nil, runs once every worker was given the
	// prepare, before scale waits for the tasks taking part to hold.
	prepared func()
}

func (rs *rescaler) readerName() string {
	if rs.down != "" {
		return rs.down
	}
	if rs.reader == "" {
		return "out"
	}
	return rs.reader
}

func contiguous(n int) []int32 {
	owner := make([]int32, queryspec.NumSlots)
	for p := range n {
		for s := range slots.OfPartition(p, n).Slots() {
			owner[s] = int32(p)
		}
	}
	return owner
}

// setMaps gives every task the map.
func (rs *rescaler) setMaps(m *SlotMap) {
	for _, w := range rs.c.workers {
		for i := range rs.c.specs[w] {
			rs.c.specs[w][i].SlotMaps = map[string]*SlotMap{rs.frag: m}
		}
	}
}

// involved lists the tasks that take part: lines (upstream), counts, out.
func (rs *rescaler) tasks(match func(*TaskSpec) bool) []string {
	var ids []string
	for _, w := range rs.c.workers {
		for _, s := range rs.c.specs[w] {
			if match(&s) {
				ids = append(ids, s.TaskID)
			}
		}
	}
	return ids
}

func (rs *rescaler) state(id string) TaskState {
	for _, st := range rs.c.states() {
		if st.TaskID == id {
			return st
		}
	}
	return TaskState{}
}

// scale rescales to n partitions while the query runs and returns the cut.
func (rs *rescaler) scale(t *testing.T, n int) int64 {
	t.Helper()
	cut, _ := rs.rescale(t, n, false)
	return cut
}

// scaleUnlessEnded is scale refusing, as the leader does
// (coordinator/rescale.go), a rescale in which a task taking part reports
// the end of its stream as its frontier (a generator that ended reports
// MaxInt64-1): there is no cut below which it could stop. It then returns
// that task's id and leaves the tasks holding, the cluster only fit to be
// closed.
func (rs *rescaler) scaleUnlessEnded(t *testing.T, n int) (cut int64, ended string) {
	t.Helper()
	return rs.rescale(t, n, true)
}

func (rs *rescaler) rescale(t *testing.T, n int, refuseEnded bool) (int64, string) {
	t.Helper()
	c := rs.c
	old := &SlotMap{Epoch: rs.epoch, Partitions: rs.partitions, Owner: rs.owner}
	next := &SlotMapNext{Epoch: rs.epoch + 1, Partitions: n, Owner: contiguous(n)}
	replicas := max(1, c.query.Replicas)
	// Prepare: tasks of added partitions, the new map as Next.
	var pls []Placement
	pls = append(pls, c.specs[c.workers[0]][0].Placements...)
	var added []TaskSpec
	for p := rs.partitions; p < n; p++ {
		for r := range replicas {
			w := (p + r) % len(c.workers)
			if rs.place != nil {
				w = rs.place(p, r)
			}
			id := queryspec.TaskID(c.query.Name, rs.frag, p, r)
			pls = append(pls, Placement{TaskID: id, Fragment: rs.frag, Partition: p, Replica: r, Generation: int(next.Epoch), WorkerAddr: c.workers[w].addr})
			added = append(added, TaskSpec{TaskID: id, Query: c.query.Name, Fragment: rs.frag, Partition: p, Replica: r,
				QueryIndex: 1, Spec: c.query, Generation: int(next.Epoch)})
		}
	}
	for _, s := range added {
		for _, pl := range pls {
			if pl.TaskID == s.TaskID {
				for _, w := range c.workers {
					if w.addr == pl.WorkerAddr {
						c.specs[w] = append(c.specs[w], s)
					}
				}
			}
		}
	}
	for _, w := range c.workers {
		for i := range c.specs[w] {
			c.specs[w][i].Placements = pls
		}
	}
	prep := *old
	prep.Next = next
	rs.setMaps(&prep)
	c.apply()
	if rs.prepared != nil {
		rs.prepared()
	}
	// A keyed fragment's upstreams, its tasks and its reader take part;
	// a source's tasks and its reader (rs.reader set).
	involved := rs.tasks(func(s *TaskSpec) bool {
		if rs.down != "" {
			return s.Fragment != "out" // the sink reads neither frag nor routes to it
		}
		return rs.reader == "" || s.Fragment == rs.frag || s.Fragment == rs.reader || s.Fragment == rs.upstream
	})
	cut := int64(math.MinInt64)
	dump := func() {
		for _, st := range c.states() {
			t.Logf("%s: %s prepared %d cut_done %d frontier %d: %s", st.TaskID, st.State, st.Prepared, st.CutDone, st.Frontier, st.Message)
		}
	}
	waitUntilOr(t, "every task holds for the rescale", func() bool {
		cut = math.MinInt64
		for _, id := range involved {
			st := rs.state(id)
			if st.Prepared != next.Epoch {
				return false
			}
			cut = max(cut, st.Frontier)
		}
		return true
	}, dump)
	if refuseEnded {
		for _, id := range involved {
			if rs.state(id).Frontier >= math.MaxInt64-1 {
				dump()
				return 0, id
			}
		}
	}
	cut++
	// Go.
	gone := *old
	nx := *next
	nx.Go, nx.Cut = true, cut
	gone.Next = &nx
	rs.setMaps(&gone)
	c.apply()
	own := rs.tasks(func(s *TaskSpec) bool { return s.Fragment == rs.frag || s.Fragment == rs.readerName() })
	waitUntilOr(t, fmt.Sprintf("every counts and out task passed the cut %d", cut), func() bool {
		for _, id := range own {
			if st := rs.state(id); st.CutDone != next.Epoch {
				if st.State == StateFailed {
					t.Fatalf("task %s failed: %s", id, st.Message)
				}
				return false
			}
		}
		return true
	}, dump)
	// A downstream that passed the cut has every removed partition's
	// stream to its end: the finish stops those tasks, and a final
	// boundary not received by then never comes (the merge would stall
	// at that input, and a snapshot of the task would hold an input its
	// copy no longer has).
	for _, w := range c.workers {
		for _, tk := range w.rt.tasksByID() {
			if tk.spec.Fragment != rs.readerName() {
				continue
			}
			tk.inMu.Lock()
			ins := slices.Clone(tk.inputs)
			tk.inMu.Unlock()
			for _, in := range ins {
				if tk.dcaaOn() && !in.watched {
					// Unwatched, failure detection found it silent after
					// each detection timeout and cut its attempt: the
					// input reconnected every ~100 ms, and a cut attempt
					// could drop a batch the merge was waiting to take.
					t.Fatalf("%s: input from %s partition %d is not watched (no failure detection, no stream state)", tk.spec.TaskID, in.upstream, in.upPartition)
				}
				if in.upstream == rs.frag && in.upPartition >= n {
					if !tk.inputEnded(in) {
						t.Fatalf("%s reported the cut of epoch %d passed with removed partition %d's stream at boundary %d, not ended", tk.spec.TaskID, next.Epoch, in.upPartition, tk.merge.inputBoundary(in.idx))
					}
				}
			}
		}
	}
	// Finish: the new map; removed partitions' tasks stop.
	rs.epoch, rs.partitions, rs.owner = next.Epoch, n, next.Owner
	if rs.starts != nil {
		st := make([]int64, n)
		for p := range st {
			switch {
			case p < len(rs.starts):
				st[p] = rs.starts[p]
			case p < old.Partitions:
				st[p] = math.MinInt64
			default:
				st[p] = cut
			}
		}
		rs.starts = st
	}
	rs.setMaps(&SlotMap{Epoch: rs.epoch, Partitions: n, Owner: rs.owner, Starts: rs.starts})
	var keep []Placement
	for _, pl := range pls {
		if pl.Fragment != rs.frag || pl.Partition < n {
			keep = append(keep, pl)
		}
	}
	for _, w := range c.workers {
		specs := c.specs[w][:0]
		for _, s := range c.specs[w] {
			if s.Fragment != rs.frag || s.Partition < n {
				s.Placements = keep
				specs = append(specs, s)
			}
		}
		c.specs[w] = specs
	}
	c.apply()
	return cut, ""
}

// TestRescaleKeyedAggregate rescales the keyed aggregate 1 -> 4 -> 2
// partitions while paced input flows, through the runtimes' FetchSlots
// between two workers. Every window of every word equals the reference
// computed from the generator, once: nothing lost, nothing counted
// twice.
func TestRescaleKeyedAggregate(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			testRescale(t, replicas)
		})
	}
}

func testRescale(t *testing.T, replicas int) {
	const rate = 4000
	yaml := fmt.Sprintf(wordsQuery, replicas, rate)
	yaml = replaceOnce(t, yaml, "parallelism: 2", "parallelism: 1")
	c := newCluster(t, 2, yaml, func(node string, p, r int) int { return p + r })
	defer c.close(t)
	rs := &rescaler{c: c, frag: "counts", partitions: 1, epoch: 1, owner: contiguous(1)}
	rs.setMaps(&SlotMap{Epoch: 1, Partitions: 1, Owner: rs.owner})
	c.apply()
	sink := queryspec.TaskID("wc", "out", 0, 0)
	waitUntil(t, "the aggregate emitted some windows", func() bool {
		tk := c.workers[0].rt.task(queryspec.TaskID("wc", "counts", 0, 0))
		return tk != nil && tk.outs[0].buf.Stats().LastID > 100
	})
	cut1 := rs.scale(t, 4)
	waitUntil(t, "the rescaled aggregate emitted more windows", func() bool {
		tk := c.workers[1].rt.task(queryspec.TaskID("wc", "counts", 1, 0))
		return tk != nil && tk.outs[0].buf.Stats().LastID > 20
	})
	cut2 := rs.scale(t, 2)
	if cut2 <= cut1 {
		t.Fatalf("cuts %d then %d: the second rescale did not come later in the stream", cut1, cut2)
	}
	// The source stops feeding the removed partitions' streams.
	src := c.workers[0].rt.task(queryspec.TaskID("wc", "lines", 0, 0))
	waitUntil(t, "the source's streams to removed partitions retired", func() bool {
		src.outMu.RLock()
		defer src.outMu.RUnlock()
		parts := src.byConsumer["counts"]
		return len(parts) == 4 && parts[2].retired.Load() && parts[3].retired.Load() && !parts[1].retired.Load()
	})
	// Copies started from snapshots taken before the rescale removed
	// partitions leave out the streams of those partitions: the source
	// (four outputs to counts, two now) and the sink (four inputs) move.
	c.move(t, queryspec.TaskID("wc", "lines", 0, 0), c.workers[0], c.workers[1], false)
	c.move(t, sink, c.workers[0], c.workers[1], true)
	got := c.tail(t, sink)
	want := reference(t, rate)
	res := results(t, got, sinkSchema(t, c.query))
	sameResults(t, res, want)
	// The rescales happened while windows were still to come.
	after := 0
	for _, tp := range got {
		if tp.Type.IsData() && tp.STime > cut2 {
			after++
		}
	}
	if after == 0 {
		t.Fatalf("no result after the second cut %d: the rescale did not happen under load", cut2)
	}
	if replicas > 1 {
		other := c.tail(t, queryspec.TaskID("wc", "out", 0, 1))
		if !sameTuples(got, other) {
			for i := range got {
				if i < len(other) && fmt.Sprint(got[i]) != fmt.Sprint(other[i]) {
					t.Logf("first difference at %d: %+v vs %+v (cuts %d %d)", i, got[i], other[i], cut1, cut2)
					break
				}
			}
			t.Fatalf("the sink's replicas differ (%d vs %d tuples)", len(got), len(other))
		}
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	i := indexOf(s, old)
	if i < 0 {
		t.Fatalf("%q not in the query", old)
	}
	return s[:i] + new + s[i+len(old):]
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
