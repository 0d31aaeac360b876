package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
	"google.golang.org/grpc/connectivity"
)

// liveMove moves task id from one worker to another as the move protocol
// does: the new copy (next generation) is started on the target with a
// Bootstrap source naming the old copy, so it fetches a stop-and-copy
// snapshot over the data plane while the old copy is still placed; then
// every task learns the new placement and the old copy is stopped at
// once, without waiting for its downstreams to drain it (the new copy
// holds the old copy's untaken output, see OutputPosition.Tail).
func (c *cluster) liveMove(t *testing.T, id string, from, to *worker) {
	c.move(t, id, from, to, true)
}

// move is liveMove; halt false leaves the old copy running (its consumers
// reading it) until the new copy has started from its snapshot.
func (c *cluster) move(t *testing.T, id string, from, to *worker, halt bool) {
	t.Helper()
	c.switchTo(c.startCopy(t, id, from, to, halt))
}

// pendingMove is a move whose new copy runs while every consumer still
// reads the old copy (startCopy); switchTo ends it.
type pendingMove struct {
	id       string
	from, to *worker
	gen      int
	// placements are the placements before the move.
	placements []Placement
}

// startCopy starts the next generation of task id on to from a snapshot
// of the copy on from; placements still name the old copy.
func (c *cluster) startCopy(t *testing.T, id string, from, to *worker, halt bool) pendingMove {
	t.Helper()
	m, restored := c.tryStartCopy(t, id, from, to, halt)
	if !restored {
		t.Fatalf("the new copy of %s did not start from a fetched snapshot (states %v)", id, c.states())
	}
	return m
}

// tryStartCopy is startCopy reporting whether the new copy started from
// the snapshot instead of failing the test when it did not (it then runs
// from the start of its inputs, and the move is not to be switched to).
func (c *cluster) tryStartCopy(t *testing.T, id string, from, to *worker, halt bool) (m pendingMove, restored bool) {
	t.Helper()
	var moved TaskSpec
	keep := c.specs[from][:0]
	for _, s := range c.specs[from] {
		if s.TaskID == id {
			moved = s
			continue
		}
		keep = append(keep, s)
	}
	if moved.TaskID == "" {
		t.Fatalf("task %s is not on the worker it moves from", id)
	}
	old := max(moved.Generation, 1)
	moved.Generation = old + 1
	moved.Bootstrap = &SnapshotSource{WorkerAddr: from.addr, TaskID: id, Generation: old, Halt: halt}
	c.specs[to] = append(c.specs[to], moved)
	to.rt.Apply(context.Background(), c.specs[to])
	if tk := to.rt.task(id); tk == nil || !tk.restored {
		return pendingMove{}, false
	}
	c.specs[from] = keep
	return pendingMove{id: id, from: from, to: to, gen: old + 1, placements: moved.Placements}, true
}

// switchTo ends a move: every task learns the new placement and the old
// copy is stopped.
func (c *cluster) switchTo(m pendingMove) {
	from, to := m.from, m.to
	var pls []Placement
	for _, pl := range m.placements {
		if pl.TaskID == m.id {
			pl.WorkerAddr, pl.Generation = to.addr, m.gen
		}
		pls = append(pls, pl)
	}
	for _, w := range c.workers {
		for i := range c.specs[w] {
			c.specs[w][i].Placements = pls
		}
	}
	from.rt.Apply(context.Background(), c.specs[from])
	for _, w := range c.workers {
		if w != from {
			w.rt.Apply(context.Background(), c.specs[w])
		}
	}
}

// TestLiveMoveOfKeyedAggregate moves one partition of a keyed aggregate
// under paced load through the FetchSnapshot RPC (the new copy fetches
// the old copy's snapshot itself) and stops the old copy as soon as the
// new one runs. The sink's stream is identical, tuple for tuple, to a run
// without the move, and matches the reference window by window and word
// by word: nothing lost, nothing repeated.
func TestLiveMoveOfKeyedAggregate(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	want := unmovedStream(t)

	c := startMoveRun(t, moving, 300)
	defer c.close(t)
	// A downstream that lags (one that stopped reading) holds the old
	// copy's output from where it is: at the move the old copy holds
	// output not every downstream took, which the new copy must hold again
	// (OutputPosition.Tail). From Register on, nothing is discarded
	// (the holder acknowledged nothing), so heldAfter is stable.
	held, err := c.from.rt.task(moving).output("out", 0)
	if err != nil {
		t.Fatal(err)
	}
	held.Register("holder")
	waitUntil(t, "the lagging downstream holds output", func() bool { return held.Stats().Tuples > 50 })
	heldAfter := held.Stats().OldestID - 1
	m := c.startCopy(t, moving, c.from, c.to, true)
	if n := c.from.rt.SnapshotsServed(); n != 1 {
		t.Fatalf("the old worker served %d snapshots, want 1", n)
	}
	// The lagging downstream finds, on the new copy, everything after its
	// position: no gap. It looks before the consumers switch: "holder" is
	// known to the old copy's buffer only, not one of the downstream
	// replicas the new copy's buffer waits for, so once the sink has
	// switched and acknowledged, the new copy rightly discards what the
	// sink took (a real lagging replica is held there by the buffer's
	// start-up wait for every downstream replica, for one lease). Looked
	// at after the switch, this raced the sink's first acknowledgement
	// on the new copy and failed about once in eight runs under load.
	// The subscription acknowledges nothing (noAck), so it does not end
	// the new copy's HoldUntilConnected either.
	conn, err := c.pool.Conn(c.to.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "wc", TaskId: moving, Consumer: "out", Generation: 2}, "", true, heldAfter)
	var first uint64
	err = sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
		first = b.Tuples[0].ID
		return dataplane.ErrStopSubscription
	})
	if err != nil || first != heldAfter+1 {
		t.Fatalf("a downstream at %d resumes on the new copy at %d (%v), want %d", heldAfter, first, err, heldAfter+1)
	}
	c.switchTo(m)
	c.sameAsUnmoved(t, want, "")
	c.noTaskFailed(t, "")
}

// TestMoveWithoutHalt: the old copy keeps running (and acknowledging its
// input) while the new copy fetches its snapshot and starts; consumers
// switch only afterwards. The new copy registered with its upstream
// before the snapshot, so the input after the snapshot's positions is
// still there for it: the sink's stream is identical to an unmoved run.
func TestMoveWithoutHalt(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	want := unmovedStream(t)

	c := startMoveRun(t, moving, 300)
	defer c.close(t)
	// The old copy goes on acknowledging its input past the snapshot's
	// positions before the new copy subscribes: only the new copy's own
	// registration keeps those tuples.
	// (It acknowledges within a millisecond of receiving; without the
	// registration the stream loses those tuples: checked by disabling
	// pinUpstreams, the sink then misses windows.)
	old := c.from.rt.task(moving)
	passed := make(chan bool, 1)
	c.to.rt.afterFetch = func(snap *TaskSnapshot) {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for i, in := range snap.Inputs {
				if in.Upstream == "lines" && old.inputs[i].sub.LastID() > in.After+200 {
					time.Sleep(5 * time.Millisecond) // let its acknowledgement go out: fault injection, not synchronisation
					passed <- true
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
		passed <- false
	}
	c.move(t, moving, c.from, c.to, false)
	if !<-passed {
		t.Fatal("the old copy did not receive past the snapshot: the test would prove nothing")
	}
	if tk := c.to.rt.task(moving); tk == nil || !tk.restored {
		t.Fatal("the new copy did not start from the snapshot")
	}
	c.sameAsUnmoved(t, want, "")
	// The new copy acknowledges under its own name (wc/counts/p0/r0@g2),
	// the name that registered with the upstream for it before the
	// snapshot, so that registration follows the copy's progress; and the
	// stopped old copy told the upstream it is gone. So the new copy alone
	// holds the upstream. (The new copy used to subscribe under the old
	// copy's name, leaving its registration to hold the upstream from
	// before the snapshot for a lease; and the old copy held it for a
	// lease after it stopped: a full buffer then stalls its producer for
	// the overrun grace.)
	up, err := c.from.rt.task("wc/lines/p0/r0").output("counts", 0)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the new copy alone holds the upstream", func() bool {
		st := up.Stats()
		return st.Subscribers == 1 && st.Laggard == moving+"@g2"
	})
}

// TestSourceMovesLive moves the generator source of the query while it
// runs: the new copy draws the records the old one had drawn, numbers its
// output after the old one's, and continues; consumers switch after it
// started. The sink's stream is identical to an unmoved run.
//
// The source paces its 20000 lines over about a second: on a starved
// machine it can end before the move takes its snapshot, which a source
// that has ended refuses (nothing of it is left to move). Such a run is
// inconclusive and runs again, a bounded number of times.
func TestSourceMovesLive(t *testing.T) {
	want := unmovedStream(t)
	const attempts = 3
	for i := range attempts {
		if sourceMovesLive(t, want) {
			return
		}
		t.Logf("attempt %d inconclusive: the old copy of the source had ended before the move's snapshot", i+1)
	}
	t.Fatalf("the source ended before the move's snapshot in %d attempts: it never moved live", attempts)
}

// sourceMovesLive is one run of TestSourceMovesLive; false when it is
// inconclusive (the old copy had ended before the snapshot).
func sourceMovesLive(t *testing.T, want []tuple.Tuple) bool {
	const moving = "wc/lines/p0/r0"
	c := startMoveRun(t, moving, 1000)
	defer c.close(t)
	old := c.from.rt.task(moving)
	m, restored := c.tryStartCopy(t, moving, c.from, c.to, false)
	if !restored {
		select {
		case <-old.genDone:
			return false
		default:
			t.Fatalf("the new copy of the source did not start from a fetched snapshot, and the old copy had not ended (states %v)", c.states())
		}
	}
	c.switchTo(m)
	tk := c.to.rt.task(moving)
	if tk == nil || !tk.restored || tk.genRestore == nil || tk.genRestore.records == 0 {
		t.Fatal("the new copy of the source did not start from the snapshot")
	}
	c.sameAsUnmoved(t, want, "")
	return true
}

// TestPinAcknowledgesNothing: registering a new copy with its upstreams
// before a live snapshot (pinUpstreams) must hold every tuple the
// upstream still has, not only those after the first batch the
// registration received. (The registration used to acknowledge that
// batch: a live move whose old copy had not yet received those tuples
// when its snapshot was taken lost them, and bench move counted lost
// and duplicated windows.)
func TestPinAcknowledgesNothing(t *testing.T) { pinHoldsTheUpstream(t, 0) }

// TestPinRetriesATimedOutRegistration: a registration that the upstream
// does not confirm within the first attempt's bound (here 1 µs, as a
// starved machine makes 500 ms) is made again with more time, not given
// up on. (It was given up on without a word: bench move under load 30
// took its live snapshot unpinned and lost 5,826 result rows.)
func TestPinRetriesATimedOutRegistration(t *testing.T) { pinHoldsTheUpstream(t, time.Microsecond) }

// pinHoldsTheUpstream pins a new copy of the word count's aggregate with
// its first registration attempt bounded by pinWait (0: the default) and
// checks that the upstream holds every tuple it had.
func pinHoldsTheUpstream(t *testing.T, pinWait time.Duration) {
	const moving = "wc/counts/p0/r0"
	c := newMoveRun(t, moving)
	defer c.close(t)
	from, to := c.from, c.to
	src := from.rt.task("wc/lines/p0/r0")
	if src == nil {
		t.Fatal("no source task")
	}
	buf, err := src.output("counts", 0)
	if err != nil {
		t.Fatal(err)
	}
	// A holder keeps the buffer from here: the registration finds many
	// tuples it must neither read nor acknowledge.
	buf.Register("holder")
	waitUntil(t, "the upstream holds tuples", func() bool { return buf.Stats().Tuples > 500 })
	oldest := buf.Stats().OldestID
	var spec TaskSpec
	for _, s := range c.specs[from] {
		if s.TaskID == moving {
			spec = s
		}
	}
	spec.Generation = 2
	to.rt.pinWait = pinWait
	to.rt.pinUpstreams(context.Background(), spec)
	// The registration's subscription has ended once only the old copy
	// is connected; the server applies a subscription's acknowledgements
	// before it counts it gone.
	waitUntil(t, "the registration's subscription ended", func() bool { return buf.Stats().Connected == 1 })
	// Release the holder: what the buffer keeps now is what the old copy
	// and the registration hold.
	buf.Ack("holder", buf.Stats().LastID)
	if st := buf.Stats(); st.OldestID > oldest {
		t.Fatalf("after the registration the upstream discarded up to %d (oldest was %d): the registration acknowledged tuples (laggard %s at %d)",
			st.OldestID-1, oldest, st.Laggard, st.LaggardAck)
	}
}

// TestStopAndCopyOfReplicatedConsumer: a stop-and-copy move of one
// replica of a sink whose other replica reads the same upstream, with the
// old copy stopped (and gone from its upstreams) before the new copy has
// subscribed. The other replica goes on acknowledging, so only the new
// copy's own registration, made before the snapshot, keeps the tuples
// after the snapshot's position: the result stays exact. (Before the
// bootstrap of a stop-and-copy move pinned its upstreams too, the
// upstream discarded them here and the sink lost windows: the cause of
// TestRescaleKeyedAggregate's "got N result rows, want 13880" in about
// one run of four, whose sink moves that way at the end.)
func TestStopAndCopyOfReplicatedConsumer(t *testing.T) {
	const rate = 4000
	c := newCluster(t, 2, fmt.Sprintf(wordsQuery, 2, rate), func(node string, p, r int) int { return p + r })
	defer c.close(t)
	c.apply()
	from, to := c.workers[0], c.workers[1]
	const moving = "wc/out/p0/r0"
	counts := from.rt.task("wc/counts/p0/r0")
	waitUntil(t, "the aggregate emitted some windows", func() bool {
		return counts.outs[0].buf.Stats().LastID > 100
	})
	up, err := counts.output("out", 0)
	if err != nil {
		t.Fatal(err)
	}
	var keep []TaskSpec
	for _, s := range c.specs[from] {
		if s.TaskID != moving {
			keep = append(keep, s)
		}
	}
	discarded := make(chan bool, 1)
	to.rt.afterFetch = func(snap *TaskSnapshot) {
		// The old copy stops and leaves its upstreams before the new
		// copy subscribes; then the other replica's acknowledgements
		// move on, until the upstream either discarded past the
		// snapshot's position or has produced well beyond it.
		from.rt.Apply(context.Background(), keep)
		after := snap.Inputs[0].After
		waitUntil(t, "the stream moves on past the snapshot", func() bool {
			st := up.Stats()
			return st.OldestID > after+1 || st.LastID > after+300
		})
		discarded <- up.Stats().OldestID > after+1
	}
	c.move(t, moving, from, to, true)
	if <-discarded {
		t.Errorf("the upstream discarded tuples after the snapshot's position before the new copy subscribed")
	}
	got := c.tail(t, moving)
	sameResults(t, results(t, got, sinkSchema(t, c.query)), reference(t, rate))
	if other := c.tail(t, "wc/out/p0/r1"); !sameTuples(got, other) {
		t.Fatalf("the sink's replicas differ (%d vs %d tuples)", len(got), len(other))
	}
}

// TestBootstrapConnectsWhilePinning: the connection to the old copy's
// worker is being made while the bootstrap pins the upstreams, so that
// its TLS handshake is not added to a move after the pin. The new copy's
// worker has never talked to the old copy's before the move: without
// the early dial, its connection stays idle until the fetch.
func TestBootstrapConnectsWhilePinning(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	c := newMoveRun(t, moving)
	defer c.close(t)
	from, to := c.from, c.to
	ready := make(chan error, 1)
	to.rt.beforePin = func(spec TaskSpec) {
		if spec.TaskID != moving {
			return
		}
		conn, err := to.rt.pool.Conn(from.addr)
		if err != nil {
			ready <- err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
			if !conn.WaitForStateChange(ctx, st) {
				ready <- fmt.Errorf("the connection to the old copy's worker is %s when the pin begins", st)
				return
			}
		}
		ready <- nil
	}
	c.move(t, moving, from, to, false)
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("the bootstrap did not pin")
	}
}
