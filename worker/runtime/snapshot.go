package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrUnknownTask means no task with the given id runs in this runtime.
var ErrUnknownTask = errors.New("no such task in this runtime")

// ErrNotSnapshottable means the task cannot be snapshotted: a source
// (its position is its generator's or its ingest client's, not yet
// captured), a task that failed, or one already halted by a snapshot.
var ErrNotSnapshottable = errors.New("task cannot be snapshotted")

// errTentativeNow is ErrNotSnapshottable for a DCAA replica whose output
// is tentative now (or that is replaying its correction): a copy could
// not take its tentative results back. Unlike the other refusals it
// passes: the replica is stable again once it has corrected itself, so
// a fetch asks again for a while (FetchSnapshot answers codes.Aborted,
// see fetchTentativeWait).
var errTentativeNow = fmt.Errorf("%w: its results are tentative now", ErrNotSnapshottable)

// ErrSnapshotMismatch means a task snapshot does not fit the task asked to
// start from it (another query, fragment or partition, other inputs or
// outputs, another operator definition).
var ErrSnapshotMismatch = errors.New("task snapshot does not fit the task")

// ErrBadTaskSnapshot means encoded task snapshot bytes are truncated,
// corrupt, or of an unknown format version.
var ErrBadTaskSnapshot = errors.New("invalid task snapshot encoding")

// errHalted ends an input whose task was halted by a stop-and-copy
// snapshot: its batch is refused, hence not acknowledged.
var errHalted = fmt.Errorf("%w: halted by a snapshot", errTaskEnded)

// TaskSnapshot is a running task's state at one point between two
// processed releases: its operators' state together with the input
// positions that state reflects and the output positions it produced. A
// copy of the task started from it (TaskSpec.FromSnapshot) subscribes
// after those input positions and numbers its output after those output
// positions, so that, fed the same input, it continues exactly as the
// task would have: the same tuples with the same ids.
//
// The input position is where the task's acknowledgements stand: every
// tuple up to After was received. Tuples received but not yet released
// (waiting in the deterministic merge for the other inputs' boundaries)
// are carried in Pending, since the upstream may already have discarded
// them.
type TaskSnapshot struct {
	TaskID, Query, Fragment string
	Partition, Replica      int
	// Operator is the operators' state (operator.Operator.Snapshot of the
	// fragment's chain); nil for a sink.
	Operator []byte
	// Released is the merge watermark of the last release: every input
	// tuple with a lower stime was processed, and the operators advanced
	// to it.
	Released int64
	// Seq is the number of data tuples the task routed (unkeyed outputs
	// of several partitions spread tuples by it).
	Seq     uint64
	Inputs  []InputPosition
	Outputs []OutputPosition
	// SourceRecords is, for a generator source, the number of records
	// drawn from its generator (Released is then its last boundary); for
	// a kafka source, the offset of the next record to read; for a kafka
	// sink's writing replica, the id up to which its writer had committed
	// its result stream to Kafka (every id up to it is in Kafka or is not
	// a result).
	SourceRecords int64
	// Ingest is an ingest source's position (see ingestmove.go); nil for
	// every other task. Encoded as an optional trailing section.
	Ingest *IngestPosition
	// SourceLevel is, for a source, the newest reconfiguration epoch it
	// produces under when it switched before its stream time reached the
	// plan's cut (an idle source, see idleSwitch): the copy tags every
	// later tuple with at least it. 0 otherwise. Encoded as an optional
	// trailing section.
	SourceLevel uint64
	// CutFrontier and CutFloors are, for a source that acknowledged a
	// reconfiguration plan still loading, its reconfiguration frontier
	// (the highest stream time it emitted, reported with its
	// acknowledgements) and the lowest cut each such plan can get
	// (planCutFloor), by epoch. The copy reports that frontier and holds
	// at those floors: the coordinator forgets the old copy's report when
	// the task moves, and without them the copy acknowledged with a lower
	// frontier, so the cut could fall below what the old copy had
	// already emitted under the old epoch. Encoded as an optional
	// trailing section (only while such a plan loads).
	CutFrontier int64
	CutFloors   []EpochFloor
	// Uncorrected is the task's note naming results a DCAA correction
	// could not make exact (its status' lossy text, "" when none), and
	// Uncorrectable the ranges of the UNCORRECTABLE records it put on its
	// outputs: a copy started from the snapshot (a replica re-placed from
	// a lossy peer's) has the same stable stream, so it says the same and
	// does not put those records again. Encoded as an optional trailing
	// section, with each output's lineage.
	Uncorrected   string
	Uncorrectable [][2]int64

	// opOwned: Operator is a buffer of the snapshot's own that nothing
	// modifies (a fetched snapshot), so the restored operators may keep
	// slices of it instead of copying it (operator.RestoreOwned).
	opOwned bool
	// early, when set, is the task's operators already restored from
	// Operator while it was fetched (restoreEarly): the task adopts them
	// instead of building and restoring its own.
	early *earlyOp
	// elided: the snapshot has an operator state of elidedSize bytes,
	// which was restored into early off the connection and not kept
	// (streamfetch.go): Operator is nil, and only a task that adopts
	// early can start from the snapshot.
	elided     bool
	elidedSize int
}

// hasOperator reports whether the snapshot holds an operator state (kept
// in Operator or elided).
func (s *TaskSnapshot) hasOperator() bool { return s.Operator != nil || s.elided }

// InputPosition is one input stream's position in a TaskSnapshot.
type InputPosition struct {
	// Upstream is the upstream fragment, Partition its partition, Port
	// the task's input port the stream feeds.
	Upstream        string
	Port, Partition int
	// After is the id of the last tuple received: the copy subscribes
	// after it.
	After uint64
	// Boundary is the latest boundary received; Steps the boundaries
	// received above Released, increasing.
	Boundary int64
	Steps    []int64
	// Pending are the data tuples received and not yet processed, in
	// stream order, ids set.
	Pending []tuple.Tuple
}

// OutputPosition is one output stream's position in a TaskSnapshot.
type OutputPosition struct {
	// Consumer is the downstream fragment ("" for a sink's result
	// stream), Partition its partition.
	Consumer  string
	Partition int
	// LastID is the id of the last tuple the task appended.
	LastID uint64
	// The tuples TailFirst..LastID the output still held (encoded, tuple
	// i at Tail[TailOffs[i]:]): not yet taken by every downstream. A copy
	// started from the snapshot holds them again, so a downstream can
	// switch to it at once, whatever it had taken, without draining the
	// old copy first. Empty when the output held nothing.
	TailFirst uint64
	TailOffs  []int
	Tail      []byte
	// NSBase and NonStable are the stream's positions outside its stable
	// view (DCAA corrections) that a copy continuing it needs: NSBase
	// counts those before the tail (or before LastID+1 without a tail),
	// NonStable are the ranges from there on (see
	// dataplane.OutputBuffer.MarkNonStable). Without them a copy of a
	// producer that corrected its output would give its consumers wrong
	// stable ids.
	NSBase    uint64
	NonStable []dataplane.PosRange
	// Lineage and LineageSince are the stream's lineage (see
	// dataplane.OutputBuffer.Diverge; 0, 0: the numbering its peer
	// replicas share): a copy continuing it numbers its stable results as
	// it did, so its consumers must know which numbering that is.
	Lineage, LineageSince uint64
}

// tailBytes bounds each read of an output's retained tuples.
const tailBytes = 4 << 20

// captureTail copies what buf still holds up to last (see
// OutputPosition.Tail).
func captureTail(buf *dataplane.OutputBuffer, pos *OutputPosition) error {
	after := uint64(0)
	for after < pos.LastID {
		data, offs, base, first, _, _, err := buf.ReadIndexed(after, tailBytes)
		if err != nil {
			return err
		}
		if len(offs) == 0 {
			return nil
		}
		if pos.Tail == nil {
			pos.TailFirst = first
		} else if first != after+1 {
			return fmt.Errorf("output to %q partition %d: retained tuples jump from %d to %d", pos.Consumer, pos.Partition, after, first)
		}
		n := min(len(offs), int(pos.LastID-first)+1)
		end := len(data)
		if n < len(offs) {
			end = offs[n] - base
		}
		for _, o := range offs[:n] {
			pos.TailOffs = append(pos.TailOffs, len(pos.Tail)+o-base)
		}
		pos.Tail = append(pos.Tail, data[:end]...)
		after = first + uint64(n) - 1
	}
	return nil
}

// SnapshotOptions configures Runtime.SnapshotTask.
type SnapshotOptions struct {
	// Halt makes it stop-and-copy: the task processes nothing after the
	// snapshot and refuses (does not acknowledge) further input, so its
	// upstreams keep everything after the snapshot's input positions for
	// the copy; its outputs stay readable until the task is stopped, so
	// that its downstreams can take everything up to the snapshot's output
	// positions first (see WaitTaken).
	Halt bool
	// Aligned, with At, takes the snapshot exactly when the task has
	// processed every release step (input boundary) at or below stream
	// time At and none above: the task stops releasing past At, and the
	// snapshot waits for all its inputs to reach At. Every partition of a
	// fragment sees the same boundaries, so snapshots of several tasks
	// aligned at one At share their watermark (TaskSnapshot.Released), as
	// merging slot states requires (operator.SlotState): the cut a rescale
	// needs. It requires Halt (the task stays held at the cut). A task
	// already past At refuses (ErrCutPassed).
	Aligned bool
	At      int64
}

// ErrCutPassed means an aligned snapshot was asked of a task that has
// already processed stream time beyond the requested cut.
var ErrCutPassed = errors.New("task is already past the requested cut")

// SnapshotTask captures a running operator or sink task's TaskSnapshot.
// It waits, or until ctx ends, for the task to finish the release it is
// processing, and holds the task between two releases while it copies:
// the state, the positions and the pending input are one consistent cut.
// Sources cannot be snapshotted yet (ErrNotSnapshottable).
func (r *Runtime) SnapshotTask(ctx context.Context, taskID string, opts SnapshotOptions) (*TaskSnapshot, error) {
	t := r.task(taskID)
	if t == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownTask, taskID)
	}
	return t.snapshot(ctx, opts)
}

// WaitTaken waits until every downstream subscriber of the task's output
// streams has acknowledged them up to the snapshot's output positions, or
// until ctx ends: then a copy started from the snapshot can replace the
// task without a downstream missing a tuple only the task had. A sink's
// result stream (a ring read by tails, never acknowledged) is not waited
// for.
func (r *Runtime) WaitTaken(ctx context.Context, taskID string, snap *TaskSnapshot) error {
	t := r.task(taskID)
	if t == nil {
		return fmt.Errorf("%w: %q", ErrUnknownTask, taskID)
	}
	taken := func() bool {
		for _, pos := range snap.Outputs {
			buf, err := t.output(pos.Consumer, pos.Partition)
			if err != nil || t.node.Kind == queryspec.KindSink {
				continue
			}
			st := buf.Stats()
			if pos.LastID > 0 && (st.Missing > 0 || st.Subscribers == 0 || st.LaggardAck < pos.LastID) {
				return false
			}
		}
		return true
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !taken() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("task %s: downstream has not taken its output up to the snapshot: %w", taskID, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// lockProc takes the task's processing lock, or gives up when ctx ends.
func (t *task) lockProc(ctx context.Context) error {
	select {
	case t.proc <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *task) unlockProc() { <-t.proc }

func (t *task) snapshot(ctx context.Context, opts SnapshotOptions) (*TaskSnapshot, error) {
	s, op, err := t.snapshotParts(ctx, opts)
	if err != nil || op == nil {
		return s, err
	}
	joined := *s
	joined.Operator = slices.Concat(op...)
	return &joined, nil
}

// snapshotParts is snapshot with a live snapshot's operator state left
// in the parts it was encoded in (operator.FreezePartsOf; op, nil when
// s.Operator holds it), so that it can be sent without being joined. The
// parts are never modified.
func (t *task) snapshotParts(ctx context.Context, opts SnapshotOptions) (s *TaskSnapshot, op [][]byte, err error) {
	s, prepare, err := t.capture(ctx, opts)
	if err != nil || prepare == nil {
		return s, nil, err
	}
	// The task processes again while its captured state is encoded.
	enc, err := prepare()
	if err == nil {
		err = enc.Write(func(p []byte) error { op = append(op, p); return nil })
	}
	if err != nil {
		return nil, nil, fmt.Errorf("task %s: operator snapshot: %w", t.spec.TaskID, err)
	}
	return s, op, nil
}

// capture takes the snapshot while holding the task between two
// releases. For a snapshot that does not halt the task, the operators'
// state is only frozen there (operator.FreezeEncodingOf): encode, when not nil,
// encodes it into the snapshot's Operator after the task is released.
func (t *task) capture(ctx context.Context, opts SnapshotOptions) (_ *TaskSnapshot, encode func() (*operator.Encoding, error), _ error) {
	if t.genSnap != nil { // generator and kafka sources
		s, err := t.snapshotSource(ctx, opts)
		return s, nil, err
	}
	if t.ingest != nil {
		s, err := t.snapshotIngest(ctx, opts)
		return s, nil, err
	}
	if t.merge == nil || t.proc == nil {
		return nil, nil, fmt.Errorf("%w: %s is a %s task", ErrNotSnapshottable, t.spec.TaskID, t.kind())
	}
	if t.dm != nil && opts.Aligned {
		return nil, nil, fmt.Errorf("%w: %s runs DCAA, whose merge cannot be aligned at a stream time yet", ErrNotSnapshottable, t.spec.TaskID)
	}
	if opts.Aligned {
		if !opts.Halt {
			return nil, nil, fmt.Errorf("%w: an aligned snapshot must halt the task", ErrNotSnapshottable)
		}
		if t.passThrough {
			return nil, nil, fmt.Errorf("%w: a pass-through sink has no merge to align", ErrNotSnapshottable)
		}
		if err := t.waitCut(ctx, opts.At); err != nil {
			return nil, nil, err
		}
		// proc is held: capture below.
	} else if err := t.lockProc(ctx); err != nil {
		return nil, nil, fmt.Errorf("task %s: snapshot: %w", t.spec.TaskID, err)
	}
	defer t.unlockProc()
	halt := opts.Halt
	if halt && !opts.Aligned && t.haltSnap != nil {
		// Asked again (a move's copy retrying a fetch that broke off): the
		// halted task has not moved since, so its snapshot is the same.
		return t.haltSnap, nil, nil
	}
	if st := t.State(); t.halted.Load() || st.State == StateFailed || st.State == StateStopped {
		return nil, nil, fmt.Errorf("%w: %s is %s (halted %v)", ErrNotSnapshottable, t.spec.TaskID, st.State, t.halted.Load())
	}
	if t.emitErr != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrNotSnapshottable, t.spec.TaskID, t.emitErr)
	}
	if t.sinkTentativeHeld() {
		return nil, nil, fmt.Errorf("%w (a copy could not take them back): %s", errTentativeNow, t.spec.TaskID)
	}
	s := &TaskSnapshot{TaskID: t.spec.TaskID, Query: t.spec.Query, Fragment: t.spec.Fragment,
		Partition: t.spec.Partition, Replica: t.spec.Replica, Seq: t.seq}
	t.stateMu.Lock()
	s.Uncorrected = t.uncorrected
	t.stateMu.Unlock()
	s.Uncorrectable = t.unc.list()
	if t.op != nil && halt {
		// Halted, the task has nothing else to do: encode now, so that a
		// second fetch of the same halted snapshot finds it complete.
		op, err := t.op.Snapshot()
		if err != nil {
			return nil, nil, fmt.Errorf("task %s: operator snapshot: %w", t.spec.TaskID, err)
		}
		s.Operator = op
	} else if t.op != nil {
		encode = operator.FreezeEncodingOf(t.op)
	}
	for _, o := range t.outs {
		last := o.w.LastID()
		if t.passThrough {
			last = o.buf.Stats().LastID
		} else if o.w.Staged() > 0 {
			// Between releases every output is flushed.
			return nil, nil, fmt.Errorf("%w: %s: output to %q partition %d has unflushed tuples", ErrNotSnapshottable, t.spec.TaskID, o.consumer, o.partition)
		}
		pos := OutputPosition{Consumer: o.consumer, Partition: o.partition, LastID: last}
		if err := captureTail(o.buf, &pos); err != nil {
			return nil, nil, fmt.Errorf("task %s: %w", t.spec.TaskID, err)
		}
		from := pos.LastID + 1
		if len(pos.TailOffs) > 0 {
			from = pos.TailFirst
		}
		pos.NSBase, pos.NonStable = o.buf.NonStableFrom(from)
		pos.Lineage, pos.LineageSince = o.buf.Lineage()
		s.Outputs = append(s.Outputs, pos)
	}
	if t.kafkaOut != nil {
		// Read after the tail: the writer stores its position before it
		// acknowledges, so the tail starts at or below it.
		s.SourceRecords = int64(t.kafkaOut.written.Load())
	}
	if t.dm != nil {
		// A DCAA operator task: its machine holds the inputs' state.
		if err := t.dm.capture(s); err != nil {
			return nil, nil, err
		}
	} else if t.passThrough {
		in := t.inputs[0]
		s.Released = math.MinInt64
		pos := InputPosition{Upstream: in.upstream, Port: in.port, Partition: in.upPartition, After: t.passLast, Boundary: math.MinInt64}
		if t.passDCAA() {
			// By stable id (see passView).
			pos.After, pos.Boundary = t.pv.stable, t.pv.stableB
		}
		s.Inputs = []InputPosition{pos}
	} else {
		ms := t.merge.capture(halt)
		s.Released = ms.released
		for i, is := range ms.inputs {
			in := t.inputs[i]
			after := is.lastID
			if t.mv != nil {
				// By stable id, as far as the merger took (see
				// mergeInput.stable): not input.stableTaken, which a
				// delivery moves after the merger's add returns.
				after = is.stable
			}
			s.Inputs = append(s.Inputs, InputPosition{Upstream: in.upstream, Port: is.port, Partition: is.upPartition,
				After: after, Boundary: is.boundary, Steps: is.steps, Pending: is.pending})
		}
	}
	if halt {
		if !opts.Aligned {
			t.haltSnap = s
		}
		t.halted.Store(true)
		t.noteWhileRunning("halted by a stop-and-copy snapshot: processes nothing more, serves its output until stopped")
	}
	return s, encode, nil
}

// waitCut holds the task's releases at stream time at and waits until it
// processed every step up to it; it returns with proc held. On failure
// the cut is lifted and proc not held.
//
// While the cut holds, the input may deliver the rest of its stream, the
// final boundary included, and then nothing more: a task that processes
// inline (one input) releases only on delivery, so both the wait for the
// cut and the lift release through kickRelease, never by a bare poke of
// the merger's wake channel (which no goroutine of an inline task reads).
func (t *task) waitCut(ctx context.Context, at int64) error {
	t.merge.setCut(at)
	lift := func() {
		t.merge.setCut(math.MaxInt64)
		t.kickRelease()
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := t.lockProc(ctx); err != nil {
			lift()
			return fmt.Errorf("task %s: aligned snapshot: %w", t.spec.TaskID, err)
		}
		reached, past := t.merge.atCut()
		if past {
			t.unlockProc()
			lift()
			return fmt.Errorf("%w: task %s, cut at %d", ErrCutPassed, t.spec.TaskID, at)
		}
		if reached {
			return nil
		}
		t.unlockProc()
		// Steps up to the cut may be waiting for release: a merge
		// goroutine is woken; an inline task releases on delivery, or
		// here once its input delivered the end of its stream.
		t.kickRelease()
		select {
		case <-ctx.Done():
			lift()
			return fmt.Errorf("task %s: aligned snapshot at %d: %w", t.spec.TaskID, at, ctx.Err())
		case <-tick.C:
		}
	}
}

func (t *task) kind() string {
	if t.node == nil {
		return "failed"
	}
	return string(t.node.Kind)
}

// restoreFrom makes a task built by newTask (not started) continue from
// a snapshot of the same query, fragment and partition (any replica: all
// replicas of a partition hold the same state at the same position).
func (t *task) restoreFrom(s *TaskSnapshot) error {
	if t.merge == nil {
		return fmt.Errorf("%w: a %s task cannot start from a snapshot", ErrNotSnapshottable, t.kind())
	}
	if s.Query != t.spec.Query || s.Fragment != t.spec.Fragment || s.Partition != t.spec.Partition {
		return fmt.Errorf("%w: snapshot of %s/%s/p%d, task %s", ErrSnapshotMismatch, s.Query, s.Fragment, s.Partition, t.spec.TaskID)
	}
	switch {
	case t.op != nil && !s.hasOperator(), t.op == nil && s.hasOperator():
		return fmt.Errorf("%w: operator state present %v, task has operators %v", ErrSnapshotMismatch, s.hasOperator(), t.op != nil)
	case t.op != nil && s.early != nil && s.early.op == t.op:
		// Restored while the snapshot arrived (newTask adopted it).
	case s.elided:
		return fmt.Errorf("%w: the operator state was restored while fetched into operators this task did not adopt", ErrSnapshotMismatch)
	case t.op != nil:
		restore := t.op.Restore
		if s.opOwned {
			restore = func(b []byte) error { return operator.RestoreOwned(t.op, b) }
		}
		if err := restore(s.Operator); err != nil {
			return fmt.Errorf("%w: %w", ErrSnapshotMismatch, err)
		}
	}
	s = inputsOfTask(s, t)
	if len(s.Inputs) != len(t.inputs) {
		var ins []string
		for _, in := range s.Inputs {
			ins = append(ins, fmt.Sprintf("%s/p%d (boundary %d, %d pending)", in.Upstream, in.Partition, in.Boundary, len(in.Pending)))
		}
		return fmt.Errorf("%w: %d inputs in the snapshot (%s), %d in the task", ErrSnapshotMismatch, len(s.Inputs), strings.Join(ins, ", "), len(t.inputs))
	}
	ms := mergeState{released: s.Released}
	for i, pos := range s.Inputs {
		in := t.inputs[i]
		if pos.Upstream != in.upstream || pos.Port != in.port || pos.Partition != in.upPartition {
			return fmt.Errorf("%w: input %d is %s partition %d port %d in the snapshot, %s partition %d port %d in the task",
				ErrSnapshotMismatch, i, pos.Upstream, pos.Partition, pos.Port, in.upstream, in.upPartition, in.port)
		}
		ms.inputs = append(ms.inputs, mergeInputState{port: pos.Port, upPartition: pos.Partition, lastID: pos.After,
			stable: pos.After, boundary: pos.Boundary, steps: pos.Steps, pending: pos.Pending})
	}
	if err := t.checkOutputs(s); err != nil {
		return err
	}
	if t.passThrough {
		if len(s.Inputs[0].Pending) > 0 {
			return fmt.Errorf("%w: a pass-through sink holds no pending input", ErrSnapshotMismatch)
		}
		t.passLast = s.Inputs[0].After
	} else if err := t.merge.install(ms); err != nil {
		return err
	}
	for i, pos := range s.Inputs {
		in := t.inputs[i]
		ref := in.sub.Ref()
		// Under the copy's name (CopyID), as the registration that pinned
		// the upstreams for it: under the task id it would be taken for
		// the old copy, whose acknowledgements run past the snapshot.
		in.sub = dataplane.NewSubscriber(ref, t.spec.CopyID(), false, pos.After)
		switch {
		case t.passThrough:
			in.sub.DeliverEncoded()
		case t.op == nil:
			in.sub.KeepValuesPacked()
		}
	}
	if err := t.resumeOutputs(s); err != nil {
		return err
	}
	for i, pos := range s.Inputs {
		t.inputs[i].stableTaken.Store(pos.After)
	}
	if t.passThrough {
		t.restorePassView(s.Inputs[0].After, s.Inputs[0].Boundary, t.outs[0].buf.Stats().LastID)
	}
	t.seq = s.Seq
	t.restored = true
	return nil
}

// inputsOfTask is the snapshot s for the copy t: without the streams of
// partitions a finished rescale removed (withoutRemovedStreams), and its
// inputs in t's order when they are the same streams. A task that a
// rescale gave inputs has them after those it started with, while a copy
// built later orders them by port, then partition.
func inputsOfTask(s *TaskSnapshot, t *task) *TaskSnapshot {
	s = withoutRemovedStreams(s, t)
	if len(s.Inputs) != len(t.inputs) {
		return s
	}
	type key struct {
		up         string
		port, part int
	}
	at := make(map[key]int, len(s.Inputs))
	for i, pos := range s.Inputs {
		at[key{pos.Upstream, pos.Port, pos.Partition}] = i
	}
	ins := make([]InputPosition, 0, len(t.inputs))
	same := true
	for i, in := range t.inputs {
		j, ok := at[key{in.upstream, in.port, in.upPartition}]
		if !ok {
			return s // not the same streams: restoreFrom says which
		}
		same = same && j == i
		ins = append(ins, s.Inputs[j])
	}
	if same {
		return s
	}
	out := *s
	out.Inputs = ins
	return &out
}

// withoutRemovedStreams returns s without the streams of partitions a
// rescale removed since the snapshot's copy was built, which the task no
// longer has: inputs from a removed upstream partition that ended (their
// final boundary received, nothing pending), and outputs to a removed
// partition of a keyed downstream. Anything else that does not fit is left
// for the checks to refuse.
func withoutRemovedStreams(s *TaskSnapshot, t *task) *TaskSnapshot {
	has := map[string]int{} // upstream -> partitions read
	for _, in := range t.inputs {
		has[in.upstream] = max(has[in.upstream], in.upPartition+1)
	}
	out := *s
	out.Inputs, out.Outputs = nil, nil
	for _, in := range s.Inputs {
		if n, ok := has[in.Upstream]; ok && in.Partition >= n && in.Boundary == finalBoundary && len(in.Pending) == 0 {
			continue
		}
		out.Inputs = append(out.Inputs, in)
	}
	for _, o := range s.Outputs {
		parts, ok := t.byConsumer[o.Consumer]
		if ok && o.Consumer != "" && o.Partition >= len(parts) {
			if down := t.plan.Node(o.Consumer); down != nil && down.KeyFields != nil {
				continue
			}
		}
		out.Outputs = append(out.Outputs, o)
	}
	return &out
}

// checkOutputs returns an error unless the snapshot's outputs are the
// task's.
func (t *task) checkOutputs(s *TaskSnapshot) error {
	if len(s.Outputs) != len(t.outs) {
		return fmt.Errorf("%w: %d outputs in the snapshot, %d in the task", ErrSnapshotMismatch, len(s.Outputs), len(t.outs))
	}
	for _, pos := range s.Outputs {
		parts := t.byConsumer[pos.Consumer]
		if pos.Partition < 0 || pos.Partition >= len(parts) || parts[pos.Partition] == nil {
			return fmt.Errorf("%w: the task has no output to %q partition %d", ErrSnapshotMismatch, pos.Consumer, pos.Partition)
		}
	}
	return nil
}

// resumeOutputs continues every output after the snapshot's position,
// holding again its tail.
func (t *task) resumeOutputs(s *TaskSnapshot) error {
	s = withoutRemovedStreams(s, t)
	if err := t.checkOutputs(s); err != nil {
		return err
	}
	for _, pos := range s.Outputs {
		o := t.byConsumer[pos.Consumer][pos.Partition]
		o.buf.RestoreNonStable(pos.NSBase, pos.NonStable)
		if len(pos.TailOffs) > 0 {
			if pos.TailFirst+uint64(len(pos.TailOffs))-1 != pos.LastID {
				return fmt.Errorf("%w: output tail %d+%d does not end at %d", ErrSnapshotMismatch, pos.TailFirst, len(pos.TailOffs), pos.LastID)
			}
			// The buffer owns what it adopts: give it its own copy.
			if err := o.w.ResumeWith(context.Background(), pos.TailFirst, slices.Clone(pos.TailOffs), slices.Clone(pos.Tail)); err != nil {
				return err
			}
		} else if err := o.w.ResumeAfter(pos.LastID); err != nil {
			return err
		}
		if pos.Lineage != 0 {
			o.buf.SetLineage(pos.Lineage, pos.LineageSince)
		}
		// Its consumers still read the copy it continues, and switch
		// later: until the first comes, a full buffer waits for them
		// rather than discard what they will ask for.
		o.buf.HoldUntilConnected()
	}
	// The copy's results are the snapshot's copy's: as exact, or not.
	if s.Uncorrected != "" {
		t.stateMu.Lock()
		t.uncorrected = s.Uncorrected
		t.stateMu.Unlock()
	}
	for _, r := range s.Uncorrectable {
		t.unc.add(r[0], r[1])
		for _, o := range t.outs {
			// Its records are on the stream it continues: readers
			// realigning onto the copy learn them (NamedRanges).
			o.buf.NoteUncorrectable(r[0], r[1])
		}
	}
	t.seq = s.Seq
	t.restored = true
	return nil
}

// Task snapshot encoding: "fsts", a version byte, then the fields in
// declaration order; integers are varints, strings and byte strings
// length-prefixed, pending tuples as (id, tuple encoding). Version 2 adds
// each output's tail (first id, tuple lengths, bytes) and, last, a
// source's record count; version 3 each output's positions outside its
// stable view (base, ranges) after its tail; versions 1 and 2 are still
// read.
const (
	taskSnapshotMagic   = "fsts"
	taskSnapshotVersion = 3
)

// MarshalBinary encodes the snapshot in the versioned format
// UnmarshalBinary reads.
func (s *TaskSnapshot) MarshalBinary() ([]byte, error) {
	return slices.Concat(s.marshalParts(nil)...), nil
}

// marshalParts is MarshalBinary's encoding in consecutive parts: the
// operator state itself is not copied, so a snapshot can be sent without
// building its encoding in one piece. With op not nil, the operator state
// is op's parts joined (snapshotParts), not s.Operator.
func (s *TaskSnapshot) marshalParts(op [][]byte) [][]byte {
	if op == nil && s.Operator != nil {
		op = [][]byte{s.Operator}
	}
	opSize := 0
	for _, p := range op {
		opSize += len(p)
	}
	head, rest := s.marshalAround(op != nil, opSize)
	if op == nil {
		return [][]byte{rest}
	}
	parts := make([][]byte, 0, len(op)+2)
	parts = append(parts, head)
	parts = append(parts, op...)
	return append(parts, rest)
}

// marshalAround is the encoding before (head) and after (rest) an
// operator state of opSize bytes; without one (hasOp false), rest is the
// whole encoding.
func (s *TaskSnapshot) marshalAround(hasOp bool, opSize int) (head, rest []byte) {
	// The output tails are nearly all of rest: size it once (re-growing
	// a slice of many MB costs more than encoding).
	size := 256
	for _, o := range s.Outputs {
		size += len(o.Tail) + 4*len(o.TailOffs) + 64
	}
	for _, in := range s.Inputs {
		size += 64 + 10*len(in.Steps) + 64*len(in.Pending)
	}
	b := make([]byte, 0, size)
	b = append(b, taskSnapshotMagic...)
	b = append(b, taskSnapshotVersion)
	bytesField := func(v []byte) {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	str := func(v string) {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	uv := func(v uint64) { b = binary.AppendUvarint(b, v) }
	iv := func(v int64) { b = binary.AppendVarint(b, v) }
	str(s.TaskID)
	str(s.Query)
	str(s.Fragment)
	uv(uint64(s.Partition))
	uv(uint64(s.Replica))
	if !hasOp {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(opSize))
		head, b = b, make([]byte, 0, size)
	}
	iv(s.Released)
	uv(s.Seq)
	uv(uint64(len(s.Inputs)))
	for _, in := range s.Inputs {
		str(in.Upstream)
		uv(uint64(in.Port))
		uv(uint64(in.Partition))
		uv(in.After)
		iv(in.Boundary)
		uv(uint64(len(in.Steps)))
		for _, st := range in.Steps {
			iv(st)
		}
		uv(uint64(len(in.Pending)))
		for k := range in.Pending {
			uv(in.Pending[k].ID)
			b = tuple.AppendTuple(b, &in.Pending[k])
		}
	}
	uv(uint64(len(s.Outputs)))
	for _, o := range s.Outputs {
		str(o.Consumer)
		uv(uint64(o.Partition))
		uv(o.LastID)
		uv(o.TailFirst)
		uv(uint64(len(o.TailOffs)))
		for i := range o.TailOffs {
			end := len(o.Tail)
			if i+1 < len(o.TailOffs) {
				end = o.TailOffs[i+1]
			}
			uv(uint64(end - o.TailOffs[i]))
		}
		bytesField(o.Tail)
		uv(o.NSBase)
		uv(uint64(len(o.NonStable)))
		for _, r := range o.NonStable {
			uv(r.From)
			uv(r.To)
		}
	}
	iv(s.SourceRecords)
	b = appendIngestPosition(b, s.Ingest)
	if s.SourceLevel > 0 {
		b = append(b, levelSectionTag)
		b = binary.AppendUvarint(b, s.SourceLevel)
	}
	if len(s.CutFloors) > 0 {
		b = append(b, cutSectionTag)
		iv(s.CutFrontier)
		uv(uint64(len(s.CutFloors)))
		for _, f := range s.CutFloors {
			uv(f.Epoch)
			iv(f.Floor)
		}
	}
	if s.lossy() {
		b = append(b, lossySectionTag)
		str(s.Uncorrected)
		uv(uint64(len(s.Uncorrectable)))
		for _, r := range s.Uncorrectable {
			iv(r[0])
			iv(r[1])
		}
		for _, o := range s.Outputs { // as many as above
			uv(o.Lineage)
			uv(o.LineageSince)
		}
	}
	return head, b
}

// lossySectionTag starts the optional trailing section holding
// TaskSnapshot.Uncorrected, Uncorrectable and the outputs' lineages
// (after the level and cut sections, if any). Only a snapshot of a task that
// named a loss or whose outputs diverged has it: an older build refuses
// such a snapshot (trailing bytes), and a copy of such a task started
// without it said its results were exact.
const lossySectionTag = 'U'

// lossy reports whether the snapshot needs its lossy section.
func (s *TaskSnapshot) lossy() bool {
	if s.Uncorrected != "" || len(s.Uncorrectable) > 0 {
		return true
	}
	for _, o := range s.Outputs {
		if o.Lineage != 0 {
			return true
		}
	}
	return false
}

// cutSectionTag starts the optional trailing section holding
// TaskSnapshot.CutFrontier and CutFloors (after the level section, if
// any). An older build refuses a snapshot that has it (trailing bytes):
// only a source snapshotted while a plan it acknowledged loads has it.
const cutSectionTag = 'C'

// EpochFloor is the lowest cut the plan of Epoch can get, as a source
// that acknowledged it computed it (TaskSnapshot.CutFloors).
type EpochFloor struct {
	Epoch uint64
	Floor int64
}

// levelSectionTag starts the optional trailing section holding
// TaskSnapshot.SourceLevel (after the ingest section, if any).
const levelSectionTag = 'L'

// snapReader decodes a task snapshot; the first error sticks.
type snapReader struct {
	b   []byte
	err error
	// alias: the operator state and output tails may be slices of b
	// (the caller hands the encoding over).
	alias bool
}

func (r *snapReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated or corrupt %s", ErrBadTaskSnapshot, what)
	}
	r.b = nil
}

func (r *snapReader) uv(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *snapReader) iv(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// small reads a partition, replica or port number.
func (r *snapReader) small(what string) int {
	v := r.uv(what)
	if v > math.MaxInt32 {
		r.fail(what)
		return 0
	}
	return int(v)
}

// count reads a collection length, which cannot exceed the bytes left
// (each element takes at least one), so a corrupt length cannot force a
// huge allocation.
func (r *snapReader) count(what string) int {
	v := r.uv(what)
	if v > uint64(len(r.b)) {
		r.fail(what)
		return 0
	}
	return int(v)
}

func (r *snapReader) str(what string) string {
	n := r.count(what)
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// bytes reads a length-prefixed byte string: a copy, or a slice of the
// input when the reader may alias it.
func (r *snapReader) bytes(what string) []byte {
	n := r.count(what)
	if r.err != nil {
		return nil
	}
	v := r.b[:n:n]
	if !r.alias {
		v = slices.Clone(v)
	}
	r.b = r.b[n:]
	return v
}

// UnmarshalBinary decodes what MarshalBinary wrote. Pending tuples' values
// are copies: nothing aliases data.
func (s *TaskSnapshot) UnmarshalBinary(data []byte) error { return s.unmarshal(data, false) }

// unmarshal is UnmarshalBinary; with alias, the operator state and the
// output tails are slices of data, which the caller must not reuse.
func (s *TaskSnapshot) unmarshal(data []byte, alias bool) error {
	return s.unmarshalOpts(data, alias, false)
}

// unmarshalOpts is unmarshal; with elided, data is an encoding whose
// operator state (its size still there) was left out: the snapshot is
// elided, with Operator nil.
func (s *TaskSnapshot) unmarshalOpts(data []byte, alias, elided bool) error {
	if len(data) < len(taskSnapshotMagic)+1 || string(data[:len(taskSnapshotMagic)]) != taskSnapshotMagic {
		return fmt.Errorf("%w: missing header", ErrBadTaskSnapshot)
	}
	v := data[len(taskSnapshotMagic)]
	if v < 1 || v > taskSnapshotVersion {
		return fmt.Errorf("%w: format version %d, this build reads 1 to %d", ErrBadTaskSnapshot, v, taskSnapshotVersion)
	}
	r := &snapReader{b: data[len(taskSnapshotMagic)+1:], alias: alias}
	var out TaskSnapshot
	out.TaskID, out.Query, out.Fragment = r.str("task id"), r.str("query"), r.str("fragment")
	out.Partition, out.Replica = r.small("partition"), r.small("replica")
	switch hasOp := r.count("operator flag"); {
	case r.err != nil:
	case hasOp == 1 && elided:
		if n := r.uv("operator state size"); n <= MaxFetchedSnapshotBytes {
			out.elided, out.elidedSize = true, int(n)
		} else {
			r.fail("operator state size")
		}
	case hasOp == 1:
		out.Operator = r.bytes("operator state")
	case hasOp != 0:
		r.fail("operator flag")
	}
	out.Released = r.iv("released")
	out.Seq = r.uv("sequence")
	nIn := r.count("input count")
	for range nIn {
		in := InputPosition{Upstream: r.str("upstream"), Port: r.small("port"), Partition: r.small("upstream partition"),
			After: r.uv("input position"), Boundary: r.iv("boundary")}
		nSteps := r.count("step count")
		for range nSteps {
			in.Steps = append(in.Steps, r.iv("step"))
		}
		nPending := r.count("pending count")
		for range nPending {
			if r.err != nil {
				break
			}
			var tp tuple.Tuple
			tp.ID = r.uv("pending id")
			n, err := tuple.DecodeTuple(r.b, &tp)
			if err != nil {
				r.fail(fmt.Sprintf("pending tuple (%v)", err))
				break
			}
			tuple.DetachStrings(tp.Values)
			r.b = r.b[n:]
			in.Pending = append(in.Pending, tp)
		}
		out.Inputs = append(out.Inputs, in)
	}
	nOut := r.count("output count")
	for range nOut {
		o := OutputPosition{Consumer: r.str("consumer"), Partition: r.small("output partition"), LastID: r.uv("output position")}
		if v >= 2 {
			o.TailFirst = r.uv("tail start")
			nTail := r.count("tail count")
			lens := make([]int, 0, nTail)
			total := 0
			for range nTail {
				n := r.count("tail tuple length")
				lens = append(lens, n)
				total += n
			}
			o.Tail = r.bytes("tail")
			if r.err == nil && len(o.Tail) != total {
				r.fail("tail")
			}
			off := 0
			for _, n := range lens {
				o.TailOffs = append(o.TailOffs, off)
				off += n
			}
			if len(o.Tail) == 0 {
				o.Tail = nil
			}
		}
		if v >= 3 {
			o.NSBase = r.uv("non-stable base")
			nr := r.count("non-stable ranges")
			for range nr {
				o.NonStable = append(o.NonStable, dataplane.PosRange{From: r.uv("non-stable from"), To: r.uv("non-stable to")})
			}
		}
		out.Outputs = append(out.Outputs, o)
	}
	if v >= 2 {
		out.SourceRecords = r.iv("source records")
	}
	if r.err == nil && len(r.b) > 0 && r.b[0] == ingestSectionTag {
		out.Ingest = r.ingestPosition()
	}
	if r.err == nil && len(r.b) > 0 && r.b[0] == levelSectionTag {
		r.b = r.b[1:]
		out.SourceLevel = r.uv("source level")
	}
	if r.err == nil && len(r.b) > 0 && r.b[0] == cutSectionTag {
		r.b = r.b[1:]
		out.CutFrontier = r.iv("cut frontier")
		for range r.count("cut floors") {
			out.CutFloors = append(out.CutFloors, EpochFloor{Epoch: r.uv("cut floor epoch"), Floor: r.iv("cut floor")})
		}
	}
	if r.err == nil && len(r.b) > 0 && r.b[0] == lossySectionTag {
		r.b = r.b[1:]
		out.Uncorrected = r.str("uncorrected note")
		for range r.count("uncorrectable ranges") {
			out.Uncorrectable = append(out.Uncorrectable, [2]int64{r.iv("uncorrectable from"), r.iv("uncorrectable to")})
		}
		for i := range out.Outputs {
			out.Outputs[i].Lineage = r.uv("output lineage")
			out.Outputs[i].LineageSince = r.uv("output lineage since")
		}
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadTaskSnapshot, len(r.b))
	}
	*s = out
	return nil
}
