package runtime

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// This file holds what several tests of moves and rescales check the
// same way, so that each test reads as what it does differently.

// noTaskFailed reports (t.Errorf, the test goes on) every task of the
// cluster in StateFailed; prefix, when not "", leads each message.
func (c *cluster) noTaskFailed(t *testing.T, prefix string) {
	t.Helper()
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("%stask %s failed: %s", prefix, st.TaskID, st.Message)
		}
	}
}

// onAnyWorker reports whether a copy of task id on some worker of the
// cluster satisfies cond.
func (c *cluster) onAnyWorker(id string, cond func(*task) bool) bool {
	for _, w := range c.workers {
		if tk := w.rt.task(id); tk != nil && cond(tk) {
			return true
		}
	}
	return false
}

// moveYAML is the query of the move tests: the words query with one
// replica, 20000 lines paced over about a second, so that a move lands
// mid-stream.
var moveYAML = fmt.Sprintf(wordsQuery, 1, 20000)

// onWorker0 places every task on the first worker.
func onWorker0(string, int, int) int { return 0 }

// moveSink is the sink task of moveYAML.
const moveSink = "wc/out/p0/r0"

// unmovedStream is the sink's stream of moveYAML run to its end on a
// cluster of two workers (every task on the first) without a move: what
// a run with a move must give again, tuple for tuple.
func unmovedStream(t *testing.T) []tuple.Tuple {
	t.Helper()
	unmoved := newCluster(t, 2, moveYAML, onWorker0)
	unmoved.apply()
	want := unmoved.tail(t, moveSink)
	unmoved.close(t)
	return want
}

// moveRun is moveYAML running on two workers, every task on from (the
// first), for a test that moves task moving to the second (to).
type moveRun struct {
	*cluster
	from, to *worker
	moving   string
}

// newMoveRun starts moveYAML on a new cluster of two workers, with the
// runtime options newCluster gives changed by each of with, for a move of
// task moving. The caller closes the cluster.
func newMoveRun(t *testing.T, moving string, with ...func(*Options)) *moveRun {
	t.Helper()
	q, err := queryspec.Parse("q.yaml", []byte(moveYAML))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{BoundaryInterval: time.Millisecond}
	for _, f := range with {
		f(&opts)
	}
	c := newClusterOpts(t, 2, q, onWorker0, opts)
	c.apply()
	return &moveRun{cluster: c, from: c.workers[0], to: c.workers[1], moving: moving}
}

// startMoveRun is newMoveRun once the task to move has emitted more than
// n tuples (waitEmitted).
func startMoveRun(t *testing.T, moving string, n uint64, with ...func(*Options)) *moveRun {
	t.Helper()
	r := newMoveRun(t, moving, with...)
	r.waitEmitted(t, n)
	return r
}

// waitEmitted waits until the task to move has emitted more than n
// tuples (on its first output): far enough into the stream for a move to
// land mid-stream.
func (r *moveRun) waitEmitted(t *testing.T, n uint64) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s emitted more than %d tuples", r.moving, n), func() bool {
		tk := r.from.rt.task(r.moving)
		return tk != nil && tk.outs[0].buf.Stats().LastID > n
	})
}

// sameAsUnmoved reads the sink's stream to its end and fails unless
// every window of every word equals the reference and the stream equals
// want (an unmoved run's, unmovedStream) tuple for tuple, ids included:
// nothing lost, nothing twice. prefix, when not "", leads the message.
func (r *moveRun) sameAsUnmoved(t *testing.T, want []tuple.Tuple, prefix string) {
	t.Helper()
	got := r.tail(t, moveSink)
	sameResults(t, results(t, got, sinkSchema(t, r.query)), reference(t, 20000))
	if !sameTuples(got, want) {
		t.Fatalf("%sthe sink's stream differs from the unmoved run's (%d vs %d tuples)", prefix, len(got), len(want))
	}
}

// startRescalable starts yaml, a query with two replicas, on two workers
// (replica r of partition p on worker p+r, so the replicas of a partition
// are apart) with rs, the rescaler of one of its fragments, at one
// partition (epoch 1). A keyed fragment (rs.starts nil: not a source)
// starts with its map on every task, as the coordinator gives it. The
// caller closes rs.c.
//
// The sinks' result streams keep a whole run (SinkBufferTuples): on a
// loaded machine failure detection may take live inputs for silent, and
// the tentative results and corrections that follow are DCAA's due answer
// (stableReplicas), but they once filled the default ring (64 Ki
// positions) of one sink replica, whose stable view then began 1.156 s
// into the stream (TestRescaleSourceReadByReplicatedOperator, load 30,
// s17: "the sink's replicas differ (31212 vs 24032 tuples)").
func startRescalable(t *testing.T, yaml string, rs rescaler) *rescaler {
	t.Helper()
	rs.c = newClusterOpts(t, 2, mustParse(t, yaml), func(node string, p, r int) int { return p + r },
		Options{BoundaryInterval: time.Millisecond, SinkBufferTuples: 1 << 20})
	rs.partitions, rs.epoch, rs.owner = 1, 1, contiguous(1)
	if rs.starts == nil {
		rs.setMaps(&SlotMap{Epoch: 1, Partitions: 1, Owner: rs.owner})
	}
	rs.c.apply()
	return &rs
}

// cutsText names the cuts of the rescales a test made, for its messages.
func cutsText(cuts []int64) string {
	s := fmt.Sprint(cuts)
	if len(cuts) == 1 {
		return "cut " + strings.Trim(s, "[]")
	}
	return "cuts " + strings.Trim(s, "[]")
}

// stableReplicas reads both replicas of the sink of a query with two
// replicas to their end and returns their stable views (stable tuples
// and boundaries, in order). Without a failure, a rescale read by
// replicated operators leaves nothing tentative, no UNDO and no REC_DONE;
// but on a loaded machine failure detection may take a live upstream for
// failed (an input silent past the detection timeout while its producer
// could not run), and then tentative output and its correction are
// DCAA's due answer. So tentative output fails the test only when no
// failure detection fired anywhere in the cluster (then the rescale
// caused it), and never hides a wrong result: the stable views are
// compared as before (rescaledAlike), without ids when a correction took
// new ones. cuts are the rescales' cuts, in order.
func (c *cluster) stableReplicas(t *testing.T, cuts ...int64) (got, other []tuple.Tuple) {
	t.Helper()
	rawGot := c.tail(t, queryspec.TaskID("wc", "out", 0, 0))
	rawOther := c.tail(t, queryspec.TaskID("wc", "out", 0, 1))
	c.corrected = false
	for _, tp := range append(slices.Clone(rawGot), rawOther...) {
		switch tp.Type {
		case tuple.Stable, tuple.Boundary:
			continue
		case tuple.Tentative, tuple.Undo, tuple.RecDone:
		default:
			t.Fatalf("a %v tuple in the sink's output without any failure (stime %d, %s)", tp.Type, tp.STime, cutsText(cuts))
		}
		if n := c.silencesDetected(); n == 0 {
			t.Fatalf("a %v tuple in the sink's output without any failure detected (stime %d, %s)", tp.Type, tp.STime, cutsText(cuts))
		}
		c.corrected = true
	}
	if c.corrected {
		t.Logf("tentative output and corrections after %d inputs were taken for silent (a loaded machine): comparing the stable views", c.silencesDetected())
	}
	return stableOnly(rawGot), stableOnly(rawOther)
}

// stableOnly is the stable view of a sink's stream: its stable tuples
// and boundaries (what UNDO never takes back), in order.
func stableOnly(ts []tuple.Tuple) []tuple.Tuple {
	var out []tuple.Tuple
	for _, tp := range ts {
		if tp.Type == tuple.Stable || tp.Type == tuple.Boundary {
			out = append(out, tp)
		}
	}
	return out
}

// silencesDetected counts the inputs failure detection took for silent
// in the whole cluster: by the tasks' watchdogs and by their DCAA
// machines.
func (c *cluster) silencesDetected() uint64 {
	var n uint64
	for _, w := range c.workers {
		for _, tk := range w.rt.tasksByID() {
			n += tk.silences.Load()
			if tk.dm != nil {
				n += tk.dm.silences.Load()
			}
		}
	}
	return n
}

// rescaledAlike checks what stableReplicas read after the test compared
// its results: the sink's replicas gave the same stream tuple for tuple
// (ids aside when a correction numbered them anew), results came after
// the last cut (the rescales happened under load), and no task failed.
func (c *cluster) rescaledAlike(t *testing.T, got, other []tuple.Tuple, cuts ...int64) {
	t.Helper()
	same := sameTuples(got, other)
	if c.corrected {
		same = slices.EqualFunc(got, other, func(x, y tuple.Tuple) bool {
			return x.Type == y.Type && x.STime == y.STime && slices.Equal(x.Values, y.Values)
		})
	}
	if !same {
		for i := range got {
			if i < len(other) && fmt.Sprint(got[i]) != fmt.Sprint(other[i]) {
				t.Logf("first difference at %d: %+v vs %+v (%s)", i, got[i], other[i], cutsText(cuts))
				break
			}
		}
		t.Fatalf("the sink's replicas differ (%d vs %d tuples)", len(got), len(other))
	}
	last := cuts[len(cuts)-1]
	if !slices.ContainsFunc(got, func(tp tuple.Tuple) bool { return tp.Type.IsData() && tp.STime > last }) {
		t.Fatalf("no result after the last cut %d: the rescale did not happen under load", last)
	}
	c.noTaskFailed(t, "")
}

// noCorrection reports every DCAA machine of the cluster that corrected
// its output (restored a checkpoint): without a failure none may (and
// without one detected, see stableReplicas, none may either).
func (c *cluster) noCorrection(t *testing.T) {
	t.Helper()
	if n := c.silencesDetected(); n > 0 {
		t.Logf("%d inputs were taken for silent (a loaded machine): corrections allowed", n)
		return
	}
	for _, w := range c.workers {
		for _, tk := range w.rt.tasksByID() {
			if tk.dm != nil && tk.dm.restores.Load() > 0 {
				t.Errorf("%s corrected its output %d times without a failure", tk.spec.TaskID, tk.dm.restores.Load())
			}
		}
	}
}
