package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/tuple"
)

// input is one input stream of a task: from one partition of the upstream
// node on one port. It subscribes to one replica of that upstream
// partition at a time and moves to another when the subscription fails,
// resuming after the last id received.
type input struct {
	t *task
	// stableTaken is, for a DCAA operator task, the stable id of the last
	// stable tuple the machine took from this input (see stableIDs).
	stableTaken atomic.Uint64
	// diverged: the replica this input read sent an UNCORRECTABLE record
	// (dcaa_uncorrectable.go); stable ids of that upstream's replicas no
	// longer match, and the ack relays acknowledge everything to a
	// worker of an older build (one of this build takes the tag instead,
	// by stream time: relayProgress).
	diverged atomic.Bool
	// endTaken: a DCAA operator task's machine took this input's final
	// boundary (a merger's input says so by its boundary instead).
	endTaken atomic.Bool
	// floor is the lowest stream time the input's stream can carry
	// (math.MinInt64: no floor): a partition a rescale added starts at
	// its cut (see merger.setFloor, dcaa.Machine.AddInput).
	floor       int64
	idx         int // index in the merger
	port        int
	upstream    string // upstream node (fragment)
	upPartition int
	sub         *dataplane.Subscriber

	mu        sync.Mutex
	current   Placement          // upstream replica of the live attempt
	cancelCur context.CancelFunc // cancels the live attempt; nil when none
	// relays cancels the ack relay to each upstream replica (by task id)
	// that has one running: a replica the input starts reading from stops
	// getting relayed acknowledgements, it gets real ones.
	relays map[string]context.CancelFunc

	// prev is the upstream copy the previous attempt read (run goroutine
	// only); switches counts the attempts that read another one.
	prev     Placement
	switches atomic.Uint64
	// target is the upstream replica the DCAA machine wants read;
	// targetWake signals a new one (machine mode only, see dcaa_run.go).
	target     dcaaTarget
	targetWake chan struct{}
	// machineAttempt is the machine's attempt number
	// (dcaa.Subscribe.Attempt) of the subscription running now: what it
	// delivers is tagged with it, so the machine ignores a batch that a
	// subscription it replaced hands over late (machine mode only).
	machineAttempt atomic.Uint64
	// health is failure detection's view of the live attempt (DCAA
	// queries only; see dcaa.go).
	health inputHealth
	// watched: failure detection watches this input (a replicated
	// query's; set before the task starts).
	watched bool
	// lastOff is the position offset at the end of the last batch of the
	// current attempt (offKnown: one came); a merging sink of a
	// replicated query only (see filterDCAA).
	lastOff  uint64
	offKnown bool
	// lw watches the lineage of the stable ids taken (DCAA only; see
	// dcaa_lineage.go), delivery goroutine only.
	lw lineageWatch
	// bg is the input's background subscription (dcaa_background.go),
	// nil when none; the DCAA run goroutine only.
	bg *bgSub
	// sbg is a DCAA sink input's background read (dcaa_sinkbg.go); the
	// task's watchInputs goroutine only. prefer is the upstream replica
	// (number + 1) it moved the input to, taken by run's next attempt;
	// bgMoves counts those moves.
	sbg     *sinkBg
	prefer  atomic.Int32
	bgMoves atomic.Uint64
	// tag is stableTaken with the lineage it counts in and the stream
	// time it reached (setTaken), under tagMu: what the ack relays and a
	// resumption by stable id state, so that an upstream replica of
	// another numbering takes them by stream time (dataplane.StableTag).
	tagMu sync.Mutex
	tag   dataplane.StableTag
}

// setTaken moves the input's stable id to g.ID (stableTaken), stating
// its lineage and stream time g for the relays.
func (in *input) setTaken(g dataplane.StableTag) {
	in.tagMu.Lock()
	in.tag = g
	in.tagMu.Unlock()
	in.stableTaken.Store(g.ID)
}

// takenTag is the tag of stable id sid: the one setTaken stored with it,
// or none (an id stored otherwise: a restored copy's, whose inputs'
// lineage is not known until their first batch).
func (in *input) takenTag(sid uint64) dataplane.StableTag {
	in.tagMu.Lock()
	g := in.tag
	in.tagMu.Unlock()
	if g.ID != sid {
		return dataplane.StableTag{ID: sid}
	}
	return g
}

// relayProgress is what the ack relays send: taken, and, by stable id,
// the tag of the input's stable id.
func (in *input) relayProgress() (uint64, dataplane.StableTag) {
	id := in.taken()
	if !in.byStableID() {
		return id, dataplane.StableTag{}
	}
	return id, in.takenTag(in.stableTaken.Load())
}

// buildInputs creates the merger and one input per (port, upstream
// partition).
func (t *task) buildInputs() {
	t.merge = newMerger(t.r.opts.InputPendingTuples)
	// Every release ends at the first step it can (merger.oneStep): one
	// boundary interval of input at most, however large the backlog.
	// Releasing a whole backlog at once (sources running ahead by up to
	// their output buffers) made one merged run per tuple of it when the
	// inputs' stimes interleave (the generators' partitions share their
	// stimes), in a slice that grew by doubling into fresh, page-faulting
	// memory: about 9 % of an unreplicated copy's CPU in BenchmarkDCAAOverhead (profile, load 35).
	t.merge.oneStep = true
	for port, up := range t.node.Inputs {
		upNode := t.plan.Node(up)
		parts := max(1, upNode.Partitions)
		if upNode.KeyFields != nil {
			t.mayGrowInputs = true
			parts = max(1, t.spec.SlotMaps[up].streams(upNode.Partitions))
		} else if upNode.Kind == queryspec.KindSource {
			// A generator source rescaled live has a map too (its
			// partitions; see srcscale.go).
			parts = max(1, t.spec.SlotMaps[up].streams(upNode.Partitions))
		}
		for p := 0; p < parts; p++ {
			in := t.newInput(port, up, p)
			if start := t.spec.SlotMaps[up].streamStart(p); start != math.MinInt64 {
				in.floor = start
				t.merge.setFloor(in.idx, start) // see setFloor
			}
			t.inputs = append(t.inputs, in)
		}
	}
	if t.op != nil {
		return
	}
	// A sink forwards its input without decoding its values. With one
	// input stream there is nothing to merge: the sink's result stream is
	// that stream as it is, same tuples and ids (as deterministic as the
	// upstream's), and each received batch becomes part of it without a
	// copy. With several, the merged tuples are renumbered and copied.
	t.passThrough = len(t.inputs) == 1 && !t.mayGrowInputs
	t.passUnordered = t.passThrough && mayBeUnordered(t.plan)
	for _, in := range t.inputs {
		if t.passThrough {
			in.sub.DeliverEncoded()
		} else {
			in.sub.KeepValuesPacked()
		}
	}
}

// newInput creates the input from partition p of upstream up on port and
// registers it with the merger.
func (t *task) newInput(port int, up string, p int) *input {
	in := &input{t: t, port: port, upstream: up, upPartition: p, floor: math.MinInt64}
	in.idx = t.merge.addInput(port, p)
	// The stream is named by the upstream task id of replica 0; each
	// attempt rewrites it for the replica actually used.
	in.sub = dataplane.NewSubscriber(&fedstreampb.StreamRef{
		Query: t.spec.Query, Partition: int32(t.spec.Partition), Consumer: t.spec.Fragment,
	}, t.spec.CopyID(), false, 0)
	return in
}

// passBatch appends a received batch to a pass-through sink's result
// stream as it is.
func (t *task) passBatch(b *dataplane.Batch) error {
	if err := t.lockProc(t.ctx); err != nil {
		b.Release()
		return err
	}
	defer t.unlockProc()
	if t.halted.Load() {
		b.Release()
		return errHalted
	}
	first, offs, data := b.FirstID, b.Offsets, b.Encoded
	b.Offsets, b.Encoded = nil, nil
	b.Release()
	defer t.counters.passed(len(offs), time.Now())
	var last tuple.Tuple
	if _, err := tuple.DecodeHeader(data[offs[len(offs)-1]:], &last); err != nil {
		t.endWith(err)
		return fmt.Errorf("%w: %w", errTaskEnded, err)
	}
	if err := t.outs[0].buf.Adopt(t.ctx, first, offs, data); err != nil {
		t.endWith(err)
		return fmt.Errorf("%w: %w", errTaskEnded, err)
	}
	t.passLast = first + uint64(len(offs)) - 1
	t.notePassedBatch(&last, offs, data)
	t.passLevel(&last)
	// A batch ends with a boundary when its upstream flushed after one and
	// it was read whole; one cut at the byte bound (a backlog read in full
	// batches, as under load) ends anywhere. Its last tuple alone missed
	// every marker inside such a batch: the sink's level, and the plan's
	// completion, waited for a later batch that happened to end with a
	// boundary (bench reconfig's overhead child timed out after 60 s
	// under load). While a plan's marker is due, the batch's boundaries
	// are looked at, as a DCAA sink does.
	if r := &t.rc; last.Type != tuple.Boundary && r.on && r.level < r.cur.Latest() {
		if lvl, ok := boundaryLevel(offs, data); ok {
			t.passLevel(&tuple.Tuple{Type: tuple.Boundary, Version: lvl})
		}
	}
	if last.Type == tuple.Boundary && last.STime == finalBoundary {
		t.endReconfig()
		t.setState(StateRunning, "input exhausted")
		return dataplane.ErrStopSubscription
	}
	return nil
}

// run subscribes until the upstream stream ends (final boundary) or the
// task stops, retrying failed subscriptions with backoff on the other
// replicas of the upstream partition.
func (in *input) run(ctx context.Context) {
	opts := in.t.r.opts
	log := in.t.log.With("upstream", in.upstream, "upstream_partition", in.upPartition)

	if a := in.t.aligned; a != nil {
		select {
		case <-a:
		case <-ctx.Done():
			return
		}
	}
	backoff := retry.Policy{Initial: opts.RetryMin, Max: opts.RetryMax}.New()
	attempt := 0
	// realignOn is the upstream replica (task id) the last attempt ended
	// on to realign (errRealign): the next attempt reads it again.
	realignOn := ""

	// down is when the failures since the last progress began
	// (dataplane.WaitReadySince redials faster early in an outage).
	var down time.Time
	// choice: for a DCAA sink, the replicas that failed it (see
	// dcaa_sinkchoice.go); read is the replica the last attempt read.
	var choice sinkChoice
	read := -1
	for ctx.Err() == nil {
		if in.t.inlineDone() {
			return // the end was processed by a rescale's lift (kickRelease)
		}
		cands := in.t.candidates(in.upstream, in.upPartition)
		var err error
		progressed := false
		moved := false
		if len(cands) == 0 {
			err = fmt.Errorf("no placement known for %s partition %d", in.upstream, in.upPartition)
		} else {
			if k := in.preferred(cands); k >= 0 {
				attempt = k // a background read found it stable again (dcaa_sinkbg.go)
			}
			pl := cands[attempt%len(cands)]
			if in.t.mv != nil || in.t.passDCAA() {
				// A DCAA sink resumes by stable id (see stableIDs): the
				// replica read next may number its stream otherwise.
				switch s := in.stableTaken.Load(); {
				case in.lw.re.on && pl.TaskID == realignOn:
					// Realigning (dcaa_lineage.go): the same replica
					// again, after the last id both numberings share.
					in.sub.ResumeAfter(in.lw.re.resumeAt)
				case in.lw.re.on:
					// Another attempt ends the realignment: it resumes
					// after the input's stable id, and its first batch
					// is checked again.
					in.lw.re.on = false
					in.sub.ResumeAfter(s)
				default:
					// By stable id (dataplane.OutputBuffer.ResumePosition):
					// on a replica that went tentative before it, from the
					// start of its tentative tail, whose results past what
					// the sink took stable go out at once (passSlow,
					// filterDCAA); before, taken as a position, that tail
					// was skipped and the sink showed no tentative result
					// for the failure. A restored copy's first attempt too
					// (its snapshot's position is a stable id). A retry on
					// the same replica reads the tail again: the sink takes
					// back what it showed (a fresh attempt) and shows it
					// again.
					in.sub.ResumeAfterStableTagged(in.takenTag(s))
				}
			}
			realignOn = ""
			read = pl.Replica
			progressed, moved, err = in.attempt(ctx, pl)
			if progressed {
				choice.delivered(pl.Replica)
			}
			if errors.Is(err, errSuperseded) {
				if in.waitSuperseded(ctx, pl) != nil {
					return
				}
				backoff.Reset()
				continue
			}
			if err == nil || errors.Is(err, errTaskEnded) {
				return // the upstream stream is complete, or the task failed
			}
			if errors.Is(err, errRealign) {
				realignOn = pl.TaskID
				in.health.silenced.Store(false) // the replica answered
				backoff.Reset()
				continue
			}
			if errors.Is(err, dataplane.ErrEndedBefore) {
				if (in.t.mv != nil || in.t.passDCAA()) && in.lw.realignBlind() {
					log.Warn("upstream replica's stream ended at or before the position this input resumed from (its replicas number their stable streams differently after a correction that could not be made exact): realigning on it by stream time from its start",
						"replica", pl.Replica, "after_id", in.stableTaken.Load())
					realignOn = pl.TaskID
					backoff.Reset()
					continue
				}
				if in.endBehind(ctx, pl) {
					return // complete too: see endBehind
				}
			}
			if in.health.silenced.Swap(false) {
				// Failure detection cancelled it: that replica failed.
				moved, err = false, fmt.Errorf("%w (replica %d, %s)", errSilent, pl.Replica, pl.WorkerAddr)
			}
		}
		if ctx.Err() != nil {
			return
		}
		if progressed || moved {
			backoff.Reset()
		}
		if progressed || moved || down.IsZero() {
			down = time.Now() // the peer unreachable from this failure on
		}
		if !moved {
			attempt++ // next time, try another replica
			if read >= 0 && len(cands) > 2 && (in.t.mv != nil || in.t.passDCAA()) {
				// A DCAA sink with three replicas or more chooses as
				// the machine's inputs do (dcaa_sinkchoice.go).
				choice.failed(read, time.Now())
				attempt = choice.next(in, cands, time.Now())
			}
		}
		if status.Code(err) == codes.NotFound || moved {
			log.Debug("subscription retry", "err", err, "attempt", attempt)
		} else {
			log.Warn("subscription failed; retrying", "err", err, "attempt", attempt, "after_id", in.sub.LastID())
		}
		if moved {
			continue
		}
		if in.waitRetry(ctx, backoff, cands, attempt, down) != nil {
			return
		}
	}
}

// endBehind ends the stream of a sink's input (replicated queries) whose
// upstream replica ended at or before the position it resumed from
// (dataplane.ErrEndedBefore: that replica numbers its stable stream
// otherwise than the one read before, after a correction that could not
// be made exact) when realigning on it is not possible (see
// lineageWatch.realignBlind): the final boundary is taken as if it had
// come, since nothing more will. It reports whether it did (false: not such a sink,
// or the task could not take it; the input retries).
func (in *input) endBehind(ctx context.Context, pl Placement) bool {
	t := in.t
	if !t.dcaaOn() || (!t.passDCAA() && t.mv == nil) {
		return false
	}
	t.log.Warn("upstream replica's stream ended at or before the position this input resumed from (its replicas number their stable streams differently after a correction that could not be made exact): taken as the end of the input",
		"upstream", in.upstream, "upstream_partition", in.upPartition, "replica", pl.Replica, "after_id", in.stableTaken.Load())
	if t.passDCAA() {
		err := t.passBatchDCAA(endBatch(in.stableTaken.Load()), false)
		return errors.Is(err, dataplane.ErrStopSubscription) || errors.Is(err, errTaskEnded)
	}
	s := in.stableTaken.Load() + 1
	if err := t.merge.add(ctx, in.idx, []tuple.Tuple{{Type: tuple.Boundary, STime: finalBoundary, ID: s}}, nil, s); err != nil {
		return false
	}
	in.setTaken(in.lw.tag(s))
	if t.inline() != nil {
		_ = t.processInline() // its errors end the task (endWith)
	}
	return true
}

// waitRetry waits before the next attempt, which reads replica
// cands[attempt]: the backoff's delay, cut short once a connection to
// that replica's worker that was down is up again (its marker and the
// tuples before it then arrive within the reconnect backoff of the
// pool, not this one's; early in an outage, since down, within
// dataplane's faster redial).
func (in *input) waitRetry(ctx context.Context, b *retry.Backoff, cands []Placement, attempt int, down time.Time) error {
	d := b.Next()
	if len(cands) == 0 {
		return retry.Sleep(ctx, d)
	}
	pl := cands[attempt%len(cands)]
	if in.t.r.task(pl.TaskID) != nil || in.t.r.pool == nil {
		return retry.Sleep(ctx, d) // read locally: no connection
	}
	conn, err := in.t.r.pool.Conn(pl.WorkerAddr)
	if err != nil {
		return retry.Sleep(ctx, d)
	}
	dataplane.WaitReadySince(ctx, conn, d, down)
	return ctx.Err()
}

// attempt runs one subscription to replica pl. moved reports that it was
// cancelled because the upstream's placement changed.
//
// When the upstream task runs in this runtime its buffer is read directly
// (no connection, no copies): a task id names one deterministic stream, so
// the local task's buffer is the stream pl names.
func (in *input) attempt(ctx context.Context, pl Placement) (progressed, moved bool, err error) {
	if h := in.t.r.beforeAttempt; h != nil {
		h(in.t.spec.CopyID(), pl)
	}
	in.sub.Ref().TaskId = pl.TaskID
	in.sub.Ref().Generation = int32(pl.Generation)
	in.countSwitch(pl)
	local, lerr := in.t.r.LocalStream(in.sub.Ref())
	var conn grpc.ClientConnInterface
	if lerr != nil {
		if conn, err = in.t.r.pool.Conn(pl.WorkerAddr); err != nil {
			return false, false, err
		}
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	in.health.onAttempt.Store(false)
	in.hear(time.Now().UnixNano())
	in.mu.Lock()
	in.current, in.cancelCur = pl, cancel
	if stop := in.relays[pl.TaskID]; stop != nil {
		stop()
		delete(in.relays, pl.TaskID)
	}
	in.mu.Unlock()
	defer func() {
		in.mu.Lock()
		in.cancelCur = nil
		in.mu.Unlock()
	}()
	fresh := true // the attempt's first batch
	resumedAfter := in.sub.LastID()
	deliver := func(ctx context.Context, b *dataplane.Batch) error {
		progressed = true
		if in.watched {
			in.health.busy.Store(true)
			defer in.delivering()
		}
		if in.t.dm != nil {
			return in.t.dm.deliver(ctx, in, b)
		}
		first := fresh
		fresh = false
		if !in.t.dcaaOn() && in.t.mv == nil {
			// Outside DCAA, input lost is named (gaploss.go), unless a
			// later copy of the task has it (superseded.go).
			if first {
				if b.FirstID > resumedAfter+1 && in.t.superseded() {
					b.Release()
					return errSuperseded
				}
				if err := in.noteInputGap(ctx, resumedAfter, b); err != nil {
					b.Release()
					return err
				}
			}
			if err := in.relayLoss(ctx, b.Tuples); err != nil {
				b.Release()
				return err
			}
		}
		if in.t.passThrough {
			if in.t.dcaaOn() {
				return in.t.passBatchDCAA(b, first)
			}
			return in.t.passBatch(b)
		}
		var stable uint64 // merging sink of a replicated query: see filterDCAA
		// watch is the input's lineage watch before filterDCAA moved it
		// (the last stream time taken, a realignment's end and the
		// lineage adopted there): it describes the batch as taken, but
		// the batch is taken only once the merger has it. When the
		// merger's add gives up (the attempt ended while it waited for
		// room), the watch goes back, so that the next attempt resumes
		// by stableTaken in the numbering it belongs to and, realigning,
		// drops only what was really taken.
		var watch lineageWatch
		if in.t.mv != nil {
			watch = in.lw
			var err error
			if stable, err = in.mergeDCAA(ctx, b, first); err != nil {
				return err
			}
			if len(b.Tuples) == 0 {
				b.Release() // nothing stable in it
				return nil
			}
		}
		// The merger hands b back (Release) once the task is done with its
		// tuples: read what is needed of it before.
		last := &b.Tuples[len(b.Tuples)-1]
		final := last.Type == tuple.Boundary && last.STime == finalBoundary
		if err := in.t.merge.add(ctx, in.idx, b.Tuples, b, stable); err != nil {
			if in.t.mv != nil {
				in.lw = watch
			}
			return err
		}
		if stable != 0 {
			// Taken only now: see filterDCAA.
			in.setTaken(in.lw.tag(stable))
		}
		if in.t.inline() != nil {
			return in.t.processInline()
		}
		if final {
			return dataplane.ErrStopSubscription
		}
		return nil
	}
	if local != nil {
		err = in.sub.RunLocal(actx, local, deliver)
	} else {
		err = in.sub.Run(actx, conn, deliver)
	}
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return progressed, true, err
	}
	return progressed, false, err
}

// taken is how far the input has taken its stream, as relayed to the
// other upstream replicas: the subscriber's position, or the merger's
// when further (the batch carrying the final boundary ends the
// subscription before the subscriber records it; a partition a rescale
// removed ends that way, and every replica it has must learn it was
// taken).
func (in *input) taken() uint64 {
	if in.diverged.Load() {
		// The other replicas number other results by the same stable
		// ids now: holding them by this input's ids could hold one back
		// for ever; they keep nothing for it instead (clamped to what
		// each produced). That is for a worker of an older build: one of
		// this build takes the relay's tag (relayProgress), by stream
		// time, and keeps what this input would need after a switch.
		return math.MaxUint64
	}
	if in.byStableID() {
		// Positions of the replica read mean other tuples on the others
		// after a correction; stable ids do not (see stableIDs).
		return in.stableTaken.Load()
	}
	n := in.sub.LastID()
	if in.t.merge != nil && !in.t.passThrough {
		n = max(n, in.t.merge.inputLastID(in.idx))
	}
	return n
}

// pauseRelays ends the input's ack relays while it is failed (silent,
// or reading a replica that advertises UP_FAILURE or STABILIZATION);
// relay starts them again once it is not. Such an input takes no stable
// tuple of that replica until the replica has corrected itself, so what
// it relays stands still, and as a connected subscriber it held every
// other replica of the upstream back once their buffers filled: the
// replicas that are fine stopped, and with them the upstreams they
// share with the failed replica, which needs their stable input to
// correct itself (a merging sink behind a lossy aggregate stalled the
// query for good). Paused, it counts as a missing subscriber: its lease,
// then the overrun grace (docs/DATAPLANE.md).
func (in *input) pauseRelays() {
	if !in.failed() {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.failed() {
		return
	}
	for id, stop := range in.relays {
		stop()
		delete(in.relays, id)
	}
}

// byStableID reports whether the input takes its stream by stable id (a
// DCAA operator task or sink): what taken relays is then a stable id,
// which each upstream replica maps to its own position of it.
func (in *input) byStableID() bool {
	return in.t.dm != nil || in.t.mv != nil || in.t.passDCAA()
}

// relayIdle is how often a relay looks again whether its upstream replica
// needs it (it is the one read from, or has no placement yet).
const relayIdle = 100 * time.Millisecond

// relay keeps an ack-only subscription to replica r of the upstream
// partition, relaying how far this task has taken the stream, whenever
// that replica is not the one the input reads from and the input is not
// failed (pauseRelays). Every upstream
// replica's buffer thus counts every downstream replica: it keeps what
// any of them might still need after a switch of replicas, and discards
// what all have taken (see docs/DATAPLANE.md).
func (in *input) relay(ctx context.Context, r int, log *slog.Logger) {
	opts := in.t.r.opts
	backoff := retry.Policy{Initial: opts.RetryMin, Max: opts.RetryMax}.New()
	for ctx.Err() == nil {
		pl, ok := in.t.replicaPlacement(in.upstream, in.upPartition, r)
		rctx, cancel := context.WithCancel(ctx)
		in.mu.Lock()
		reading := in.cancelCur != nil && in.current.TaskID == pl.TaskID
		// A failed input pauses its relays (see pauseRelays); checked
		// under mu, as pauseRelays cancels, so none starts after it.
		paused := in.failed()
		if ok && !reading && !paused {
			if in.relays == nil {
				in.relays = map[string]context.CancelFunc{}
			}
			in.relays[pl.TaskID] = cancel
		}
		in.mu.Unlock()
		if !ok || reading || paused {
			cancel()
			if !sleepCtx(ctx, relayIdle) {
				return
			}
			continue
		}
		ref := &fedstreampb.StreamRef{Query: in.t.spec.Query, TaskId: pl.TaskID, Partition: int32(in.t.spec.Partition), Consumer: in.t.spec.Fragment, Generation: int32(pl.Generation)}
		start := time.Now()
		var err error
		stable := in.byStableID()
		if local, lerr := in.t.r.LocalStream(ref); lerr == nil {
			err = dataplane.RelayAcksLocalTagged(rctx, local, in.t.spec.CopyID(), stable, in.relayProgress)
		} else if conn, cerr := in.t.r.pool.Conn(pl.WorkerAddr); cerr != nil {
			err = cerr
		} else {
			err = dataplane.RelayAcksTagged(rctx, conn, ref, in.t.spec.CopyID(), stable, in.relayProgress)
		}
		in.mu.Lock()
		if in.relays[pl.TaskID] != nil && rctx.Err() == nil {
			delete(in.relays, pl.TaskID)
		}
		in.mu.Unlock()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			// Cancelled: the input reads from this replica now.
			backoff.Reset()
			continue
		}
		// An upstream replica that is down or not started yet is normal
		// in a replicated query: quietly retry.
		log.Debug("ack relay ended; retrying", "replica", r, "err", err)
		if time.Since(start) > time.Second {
			backoff.Reset()
		}
		if backoff.Wait(ctx) != nil {
			return
		}
	}
}

// sinkAppend appends the released data tuples below step, from
// runs[*ri].tuples[*ti] on, to a sink's result stream, and advances the
// position past them.
func (t *task) sinkAppend(ctx context.Context, runs []mergedRun, ri, ti *int, step int64) error {
	o := t.outs[0]
	for *ri < len(runs) {
		ts := runs[*ri].tuples
		for k := *ti; k < len(ts); k++ {
			tp := &ts[k]
			if tp.STime >= step {
				*ti = k
				return nil
			}
			if err := t.appendTo(ctx, o, tp); err != nil {
				return err
			}
		}
		*ri, *ti = *ri+1, 0
	}
	return nil
}

// placementsChanged cancels the live attempt when its upstream replica no
// longer runs where it did, so the input resubscribes where it is now.
func (in *input) placementsChanged() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cancelCur == nil {
		return
	}
	now, ok := in.t.placementOf(in.upstream, in.upPartition, in.current.TaskID)
	if !ok || now.WorkerAddr != in.current.WorkerAddr || now.Generation != in.current.Generation {
		in.cancelCur()
		in.cancelCur = nil
	}
}

// stopAttempt ends the input's live subscription, if any: the task has
// processed the end of its stream (see kickRelease), and run returns.
func (in *input) stopAttempt() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.cancelCur != nil {
		in.cancelCur()
		in.cancelCur = nil
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runMerge is the process goroutine of operator and sink tasks with more
// than one input: it waits for the merge watermark to move and processes
// each release step.
func (t *task) runMerge() {
	ctx := t.ctx
	emitter := operator.EmitFunc(func(tp *tuple.Tuple) { t.emitData(ctx, tp) })
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.merge.wake:
		}
		done, err := t.processReleases(ctx, emitter)
		if err != nil {
			t.endWith(err)
			return
		}
		if done {
			t.setState(StateRunning, "input exhausted")
			return
		}
	}
}

// errTaskEnded, returned by an input's delivery, means the task failed
// or finished processing: the input stops instead of resubscribing.
var errTaskEnded = errors.New("task ended")

// processInline is the processing of a task with a single input, run by
// that input's goroutine right after each delivery instead of by
// runMerge: no hand-off to another goroutine (nor, often, to another
// CPU, whose cache does not hold the batch just decoded). It returns
// dataplane.ErrStopSubscription once the final boundary is processed.
func (t *task) processInline() error {
	done, err := t.processReleases(t.ctx, t.inline())
	if err != nil {
		t.endWith(err)
		return fmt.Errorf("%w: %w", errTaskEnded, err)
	}
	if done {
		t.setState(StateRunning, "input exhausted")
		return dataplane.ErrStopSubscription
	}
	return nil
}

// processReleases processes every release the merger has ready. done
// reports the final boundary. Processing uses the task's context, not a
// subscription's: a resubscription must not interrupt a release half
// processed.
func (t *task) processReleases(ctx context.Context, emitter operator.Emitter) (done bool, err error) {
	for {
		if err := t.lockProc(ctx); err != nil {
			return false, err
		}
		done, more, err := t.processOne(ctx, emitter)
		t.unlockProc()
		if err != nil || done || !more {
			return done, err
		}
	}
}

// processOne processes one release, if the merger has one and the task is
// not halted; more reports that it had one. The caller holds proc.
func (t *task) processOne(ctx context.Context, emitter operator.Emitter) (done, more bool, err error) {
	if t.halted.Load() || t.rc.ended.Load() {
		// Ended: the final step is processed and reconfiguration is
		// installed off the producer from now on (endReconfig).
		return false, false, nil
	}
	if err := t.pollReconfig(); err != nil {
		return false, false, err
	}
	rel, ok := t.merge.take()
	if !ok {
		return false, false, nil
	}
	start := time.Now()
	blocked := t.blockedNanos()
	t.busyBlocked.Store(blocked)
	t.busySince.Store(start.UnixNano())
	if t.mv != nil {
		// Tentative results go before stable ones are appended.
		if err := t.beforeStable(ctx); err != nil {
			return false, true, err
		}
	}
	done, err = t.release(ctx, rel.runs, rel.steps, emitter)
	if err == nil {
		err = t.spendCost(ctx, rel.runs)
	}
	t.busySince.Store(0)
	t.counters.released(t, rel.runs, start, blocked)
	// The operator and the outputs keep nothing of the released tuples
	// (see operator.Emitter; outputs encode at once).
	for _, b := range rel.finished {
		b.Release()
	}
	if err == nil {
		err = t.flush(ctx)
	}
	if err == nil && t.mv != nil {
		err = t.syncTentative(ctx)
	}
	return done, true, err
}

// release feeds, for each step, the released tuples below it to the
// operator (or straight to the output for a sink), advances the operator
// to the step and forwards it as a BOUNDARY. done reports the final
// boundary.
func (t *task) release(ctx context.Context, runs []mergedRun, steps []int64, emitter operator.Emitter) (done bool, err error) {
	ri, ti := 0, 0 // next tuple: runs[ri].tuples[ti]
	for _, step := range steps {
		if t.node.Kind == queryspec.KindSink {
			// A sink only renumbers its merged input into its result
			// stream: one loop, without routing.
			if err := t.sinkAppend(ctx, runs, &ri, &ti, step); err != nil {
				return false, err
			}
		}
		for ri < len(runs) {
			r := &runs[ri]
			tp := &r.tuples[ti]
			if tp.STime >= step {
				break
			}
			if ti++; ti == len(r.tuples) {
				ri, ti = ri+1, 0
			}
			if t.op == nil {
				t.emitData(ctx, tp)
			} else if err := t.op.Process(r.port, tp, emitter); err != nil {
				if !errors.Is(err, operator.ErrEval) {
					return false, fmt.Errorf("operator %s: %w", t.node.Name, err)
				}
				// A run-time expression failure drops the tuple, the same
				// way on every replica.
				t.dropped(err)
			}
			if t.emitErr != nil {
				return false, t.emitErr
			}
		}
		if t.op != nil {
			if err := t.op.Advance(step, emitter); err != nil {
				return false, fmt.Errorf("operator %s: advance to %d: %w", t.node.Name, step, err)
			}
			if t.emitErr != nil {
				return false, t.emitErr
			}
		}
		t.reconfigStep(step)
		if err := t.emitBoundary(ctx, step); err != nil {
			return false, err
		}
		if step == finalBoundary {
			t.endReconfig()
			return true, nil
		}
	}
	return false, nil
}

// spendCost spends the operator's configured per-tuple cost (queryspec
// Operator.Cost) on a processed release: the time counts as busy, as real
// work would, so a test or benchmark can give an operator a calibrated
// processing rate. It waits on a timer, not the CPU (a benchmark of
// dozens of instances on a few cores could not spin), and returns early
// (with the context's error) when the task stops.
func (t *task) spendCost(ctx context.Context, runs []mergedRun) error {
	if t.node == nil || t.node.Op == nil || t.node.Op.Cost == "" {
		return nil
	}
	n := 0
	for i := range runs {
		n += len(runs[i].tuples)
	}
	d := time.Duration(n) * t.node.Op.CostDuration()
	if f := t.r.opts.CostScale; f > 0 {
		d = time.Duration(float64(d) * f)
	}
	return t.cost.spend(ctx, d, sleepTimer)
}

// costClock makes a series of cost waits add up to what they owe: a timer
// wakes late (by tens of microseconds on an idle machine, by milliseconds
// on a loaded one), which at one wait per release of a few tuples made an
// operator calibrated at 1 ms a tuple take 1.2 ms (830 tuples per second,
// not 1000). Each wait measures how long it really slept and carries the
// difference into the next one, so n tuples cost n times the cost plus at
// most one late wake-up, and the operator's true processing rate is its
// calibrated one.
type costClock struct {
	// debt is what is owed and not slept yet; negative after a late
	// wake-up (the next waits are that much shorter).
	debt time.Duration
}

// spend waits what is owed for d more of cost, using sleep, which reports
// how long it really slept.
func (c *costClock) spend(ctx context.Context, d time.Duration, sleep func(context.Context, time.Duration) (time.Duration, error)) error {
	if d <= 0 {
		return nil
	}
	c.debt += d
	if c.debt <= 0 {
		return nil
	}
	slept, err := sleep(ctx, c.debt)
	c.debt -= slept
	return err
}

// sleepTimer waits d on a timer (or until ctx ends) and says how long it
// waited.
func sleepTimer(ctx context.Context, d time.Duration) (time.Duration, error) {
	start := time.Now()
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return time.Since(start), nil
	case <-ctx.Done():
		return time.Since(start), ctx.Err()
	}
}
