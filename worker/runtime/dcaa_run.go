package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/dcaa"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/tuple"
)

// dcaaRun drives an operator task of a replicated query through its DCAA
// machine (worker/dcaa) instead of the stable-only merger: the inputs
// hand every batch and heartbeat to it, the machine decides which
// upstream replica each input reads, when a bucket waiting for a failed
// input is released tentative (after the task's share of X), when to
// checkpoint the operator (its Snapshot, before the first tentative tuple
// enters it) and when to restore it and replay the stable input; this
// goroutine carries out those decisions on the operator and the outputs.
//
// Output streams keep numbering stream positions (transport ids:
// subscriptions resume and acknowledge by them). Tentative tuples take
// positions like any other; UNDO carries, in its STime, the position of
// the last stable tuple of that stream (everything after it is taken
// back); the corrections and REC_DONE follow at new positions (see
// docs/DATAPLANE.md).
type dcaaRun struct {
	t      *task
	m      *dcaa.Machine
	events chan dcaaEvent
	origin time.Time

	// Processing state (the run goroutine only).
	checkpoint []byte
	// ckptSeq is the task's routing sequence at the checkpoint: unkeyed
	// tuples to several downstream partitions are spread by it, so the
	// corrections must be routed from the same point as a failure-free
	// run's (see task.emitData).
	ckptSeq  uint64
	emitType tuple.Type
	tentWM   int64
	// lastStable is, per output stream, the position of its last stable
	// tuple or boundary: an UNDO's target.
	lastStable []uint64
	// nsOpen is, per output stream, whether a range of positions outside
	// its stable view is open (tentative tuples appended, no UNDO yet).
	nsOpen []bool
	ended  []bool
	done   bool
	// recDoneSent: this replay's REC_DONE went out before the final
	// boundary; the machine's RecDone action is done already.
	recDoneSent bool
	// replyTo holds, by peer, the channel of a permission request being
	// answered (see Reconcile).
	replyTo map[int]chan bool
	peers   peerFigures
	// tentSteps counts the steps released tentatively, restores the
	// corrections started, shed the stable tuples dropped for the bound on
	// what a replay keeps, keptMax the most kept at once after a bound
	// (figures, readable from any goroutine).
	tentSteps, restores, shed, keptMax atomic.Uint64
	// silences counts the machine's inputs timed out for silence
	// (Figures.Silences).
	silences atomic.Uint64
	// limit is the machine's DetectLimit after its last step: the
	// silence after which the task's watchdog takes an input's replica
	// for failed (see task.detectLimit).
	limit atomic.Int64
	// starveCap is the wall silence past which an input is failed
	// however starved this process was (see starveCapOf).
	starveCap int64
	// detectMax and healthMax are the machine's Config.DetectMax and
	// Config.HealthMax.
	detectMax, healthMax time.Duration
	// shedCounted is the machine's ShedData already added to the task's
	// InTuples (the run goroutine only).
	shedCounted uint64
	// lostFrom, lostTo: the results a correction could not make exact
	// (stream times; see lost), for tests.
	lostFrom, lostTo atomic.Int64
	// wait bounds the input waiting in the machine (dcaa_bound.go).
	wait waitState
	// backgrounds counts the background subscriptions started,
	// promotions the inputs that took their corrections and moved to
	// their replica (dcaa_background.go; readable from any goroutine).
	backgrounds, promotions atomic.Uint64
}

// dcaaEvent is an input's event for the machine, or the end of an input
// (ended >= 0: its final boundary was delivered). A delivered batch's end
// is noted as the machine takes it (tookIDs.final), not by such an event.
type dcaaEvent struct {
	ev    dcaa.Event
	ended int
	// reply receives the machine's answer to a PermissionRequest.
	reply chan bool
	// processed, when set, is closed once the machine took the event.
	processed chan struct{}
	// took, with a batch's Deliver, is what the input's stable id
	// becomes if the machine takes the batch (see tookIDs).
	took *tookIDs
}

// tookIDs is what taking a delivered batch does to its input's stable id
// (input.stableTaken): the last stable id in the batch, or, renumber, the
// batch's numbering from its first stable tuple on (a realignment); and,
// final, to its end (the batch holds the final boundary). The
// run goroutine records it as the machine's Step takes the batch, not
// the delivery once it hears that the event was processed: the delivery
// may give up waiting (its subscription cancelled, by a move of the
// upstream or a new choice of replica) after the machine took the batch,
// and the machine's next Subscribe resumes after the ids it took. With
// stableTaken left behind, that resumption looked like a skip over ids
// the replica no longer held, and the input named the results between as
// lost (lineageWatch.gapAfter), though nothing was missing
// (TestRescaleKeyedAggregate, TestRescaleReadByReplicatedJoin in CI).
// Likewise a final boundary taken so was never noted (input.endTaken),
// and a rescale waiting for the end of a removed partition's stream
// (inputEnded) waited for a later subscription to find that end again.
type tookIDs struct {
	in       *input
	attempt  uint64
	last     uint64
	renumber bool
	final    bool
	// tag: last's lineage and stream time, as the input's lineage watch
	// saw the batch (input.setTaken).
	tag dataplane.StableTag
	// taken: the machine took the batch (set before processed closes);
	// false, it ignored it (an attempt it had replaced).
	taken bool
}

// takes is called just before the machine's Step of a batch's Deliver
// (k; nil: another event), under proc: it reports whether that Step takes
// the batch (the Step may itself move the input to another subscription,
// so it is asked before).
func (d *dcaaRun) takes(k *tookIDs) bool {
	if k == nil {
		return false
	}
	k.taken = d.m.Takes(k.in.idx, k.attempt)
	return k.taken
}

// record moves the input's stable id as the batch was taken (the run
// goroutine only: it owns d.ended). Not lowered by a batch of a replica
// that went tentative before the input's last stable tuple (read from its
// tentative tail, dataplane.OutputBuffer.ResumePosition): its stable ids
// end below the one taken, and mean the same results (a realignment,
// renumbering, follows the new replica's numbering instead).
func (d *dcaaRun) record(k *tookIDs) {
	if k.renumber || k.last > k.in.stableTaken.Load() {
		k.in.setTaken(k.tag)
	}
	if k.final {
		// The final boundary ends the stream, wherever it is in the
		// batch (a producer's REC_DONE may follow it).
		d.setEnded(k.in.idx)
		k.in.endTaken.Store(true)
	}
}

// dcaaTarget is the upstream replica the machine wants an input to read.
type dcaaTarget struct {
	set     bool
	replica int
	after   uint64
	// attempt is the machine's number for the subscription (see
	// input.attempt).
	attempt uint64
	// seq counts targets: an attempt ended by a new target is no failure.
	seq uint64
}

// usesMachine reports whether the task runs its DCAA machine: operator
// tasks of replicated queries. (Sinks keep passing their input through
// or merging it; their inputs still detect failures, see dcaa.go.)
func (t *task) usesMachine() bool {
	return t.dcaaOn() && t.node.Kind == queryspec.KindOperator && t.op != nil
}

// newDCAARun builds the machine of an operator task of a replicated
// query. The task's share of X comes from the query's plan.
func newDCAARun(t *task) (*dcaaRun, error) {
	shares, err := dcaa.PlanShares(t.plan)
	if err != nil {
		return nil, err
	}
	budgets, err := dcaa.PlanBudgets(t.plan)
	if err != nil {
		return nil, err
	}
	ks := make([]int, len(t.inputs))
	floors := make([]int64, len(t.inputs))
	ranks := make([]int64, len(t.inputs))
	for i, in := range t.inputs {
		ks[i] = max(1, t.plan.Query.Replicas)
		// The stream of a partition a rescale added starts at its cut.
		floors[i] = in.floor
		ranks[i] = in.rank()
	}
	detectMax := dcaa.DetectMax(t.detectTimeout(), shares[t.node.Name])
	healthMax := dcaa.HealthLimitMax(t.detectTimeout(), shares[t.node.Name])
	m, err := dcaa.New(dcaa.Config{ID: t.spec.Replica, Replicas: max(1, t.plan.Query.Replicas), Inputs: ks, Floors: floors, Ranks: ranks,
		Share: shares[t.node.Name], Budget: budgets[t.node.Name], Detect: t.detectTimeout(),
		DetectMax: detectMax, HealthMax: healthMax, StartGrace: dcaa.StartGrace(t.detectTimeout()), KeepLimit: t.r.opts.DCAAKeepTuples, Background: !t.r.opts.DCAANoBackground})
	if err != nil {
		return nil, err
	}
	d := &dcaaRun{t: t, m: m, events: make(chan dcaaEvent, 64), origin: time.Now(),
		lastStable: make([]uint64, len(t.outs)), nsOpen: make([]bool, len(t.outs)), ended: make([]bool, len(t.inputs)), emitType: tuple.Stable, replyTo: map[int]chan bool{}}
	d.wait.grow(len(t.inputs))
	d.limit.Store(int64(m.DetectLimit()))
	d.starveCap = starveCapOf(t.detectTimeout(), shares[t.node.Name])
	d.detectMax, d.healthMax = detectMax, healthMax
	return d, nil
}

// starveCapOf is the wall silence past which an input of an operator task
// with detection timeout detect and share of X share is failed however
// starved its process was (vouching stops the machine's DetectLimit
// before it, see input.silence): half the share, where that leaves room
// for the stretched timeout (dcaa.DetectMax) and one detection timeout
// more; otherwise starveLimit, as for every other task. A process loaded
// for good (load 20 and more on two cores) counts most of its time as
// starved, so this cap is when a held replica is taken for failed there:
// with starveLimit alone (5 s) it came 3.7 s after the hold at load 22
// with X = 5 s, and the input caught up on the other replica too late
// for the buckets' wait (TestDCAAOneReplicaLostNoTentative: 4 tentative
// results); with the cap on the vouching alone, the machine's own
// timeout still came a stretched timeout later (3-4 s: 25 to 45
// tentative results). Half the share leaves the other half for the
// switch. A share too small for that cannot be kept by any cap under
// such load, and a lower cap only took live replicas for failed there:
// with 800 ms (X = 300 ms) the inputs moved every 400 ms at load 23,
// hearing no replica (TestDCAASecondFailureDuringStabilization), and
// with 2 s the peer replica of TestLossyReplicaRebootstrapsFromStablePeer
// lost input in every run at load 20.
//
// The machine's timeout stretches past DetectMax while its process runs
// late (local health, up to dcaa.HealthLimitMax): the room is left for
// that one.
func starveCapOf(detect, share time.Duration) int64 {
	if share > 0 && share != dcaa.Strict && share/2 >= dcaa.HealthLimitMax(detect, share)+detect {
		return min(int64(share/2), starveLimit(detect))
	}
	return starveLimit(detect)
}

func (d *dcaaRun) now() int64 { return int64(time.Since(d.origin)) }

// post hands an event to the run goroutine.
func (d *dcaaRun) post(ctx context.Context, ev dcaaEvent) error {
	select {
	case d.events <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.t.ctx.Done():
		return d.t.ctx.Err()
	}
}

// deliver is an input's delivery in machine mode: the batch goes to the
// machine, which keeps its stable tuples in place (no copy) and hands the
// batch back to the decoder's pool (Release) once it no longer needs them
// (dcaa.Deliver.Owner). Nothing here touches the batch after posting it.
func (d *dcaaRun) deliver(ctx context.Context, in *input, b *dataplane.Batch) error {
	ts := b.Tuples
	st := dcaa.StateFromProto(fedstreampb.ReplicaState(in.health.upState.Load()))
	wm := in.health.tentWM.Load()
	if d.t.halted.Load() {
		return errHalted // unacknowledged: the copy resumes before it
	}
	stableLast, final, err := renumberStable(b)
	if err != nil {
		return fmt.Errorf("input %s partition %d: %w", in.upstream, in.upPartition, err)
	}
	// The input waits until the machine took the batch, so that what the
	// subscription acknowledges is always in the machine's state (as a
	// task snapshot captures it), never only queued.
	if err := d.waitRoom(ctx, in.idx); err != nil {
		return err
	}
	if n := uint64(len(ts)); n > d.wait.batchMax.Load() {
		d.wait.batchMax.Store(n)
	}
	processed := make(chan struct{})
	// Live reconfiguration's markers ride on the boundaries (an upstream
	// may send them before this task hears of the plan); the levels rise
	// at the machine's stable steps (release).
	d.t.merge.noteMarks(in.idx, ts)
	// A switch onto a replica whose stable ids mean other results
	// (dcaa_lineage.go): the input realigns by stream time, and names
	// only what it cannot vouch for, like an upstream's record.
	attempt := in.machineAttempt.Load()
	taken := in.stableTaken.Load()
	fresh := in.lw.attempt != attempt
	in.lw.attempt = attempt
	al := in.lw.align(ts, fresh, b.Lineage, b.LineageSince, taken, b.Named)
	if al.resubscribe {
		d.t.log.Info("DCAA input switched to an upstream replica whose stable ids mean other results: realigning by stream time",
			"input", in.upstream, "partition", in.upPartition, "taken", taken, "resume_after", in.lw.re.resumeAt)
		return errRealign // unacknowledged: runMachine resubscribes after resumeAt
	}
	for _, r := range al.named {
		d.t.log.Warn("DCAA input switched to an upstream replica that numbers its results otherwise; results of one range named as not corrected",
			"input", in.upstream, "partition", in.upPartition, "from", r[0], "to", r[1])
	}
	for _, r := range al.gap {
		logGap(d.t.log, in, taken, r)
	}
	ts, marks := al.ts, al.marks
	causes := lossCauses{gap: al.gap}
	if taken == 0 && !al.skip && !al.renumber {
		if r, ok := d.t.lostBeforeStart(in, ts); ok {
			marks = append(marks, r)
			causes.restart = append(causes.restart, r)
		}
	}
	if al.skip {
		// Realigning, all of it was taken from the other replica:
		// acknowledged, not delivered; the machine hears the input is
		// alive.
		if len(marks) > 0 {
			if err := d.divergeBefore(ctx, marks); err != nil {
				return err
			}
			in.diverged.Store(true)
			if err := d.relayUncorrectable(ctx, marks, causes); err != nil {
				return err
			}
		}
		d.heartbeat(in, fedstreampb.ReplicaState(in.health.upState.Load()), wm, true)
		b.Release()
		return nil
	}
	if len(marks) > 0 {
		// The records go out before the machine takes the batch: it may
		// release results past them, and when the batch holds the
		// upstream's final boundary, the task's own final boundary,
		// which ends a consumer's subscription (a record put after it
		// was never read: TestDCAARealignRecordBeforeTheEndReachesTheSink).
		// putUncorrectable gives the outputs their own lineage first, as
		// divergeBefore did.
		in.diverged.Store(true)
		if err := d.relayUncorrectable(ctx, marks, causes); err != nil {
			return err
		}
	}
	ev := dcaa.Deliver{Input: in.idx, Tuples: ts, Upstream: st, TentWatermark: wm, Attempt: in.machineAttempt.Load(), Owner: b, Renumber: al.renumber}
	took := &tookIDs{in: in, attempt: ev.Attempt, last: stableLast, renumber: al.renumber, final: final, tag: in.lw.tag(stableLast)}
	if err := d.post(ctx, dcaaEvent{ev: ev, ended: -1, processed: processed, took: took}); err != nil {
		return err
	}
	if posted := d.t.r.dcaaPosted; posted != nil {
		posted(in)
	}
	select {
	case <-processed:
	case <-ctx.Done():
		return ctx.Err()
	case <-d.t.ctx.Done():
		return d.t.ctx.Err()
	}
	if d.t.halted.Load() {
		return errHalted
	}
	if !took.taken {
		// The machine moved the input to another subscription before it
		// took this batch, and ignored it: what this one brought (its
		// final boundary too) comes from the next. Unacknowledged.
		return errReplaced
	}
	// The machine took the batch (its stable ids, and its end, are the
	// input's: see tookIDs).
	if final {
		return dataplane.ErrStopSubscription
	}
	return nil
}

// endBatch is a batch holding only the final boundary, with stable id
// after+1: an input whose upstream replica ended at or before the
// position it resumed from (dataplane.ErrEndedBefore) delivers it, as
// the end of its stream, since the replica will send nothing more.
func endBatch(after uint64) *dataplane.Batch {
	enc := tuple.AppendTuple(nil, &tuple.Tuple{Type: tuple.Boundary, STime: finalBoundary})
	return &dataplane.Batch{Tuples: []tuple.Tuple{{Type: tuple.Boundary, STime: finalBoundary}},
		FirstID: after + 1, LastID: after + 1, Encoded: enc, Offsets: []int{0}}
}

// errRealign ends a subscription whose first batch showed that the
// replica numbers its stable ids otherwise past the ones both share
// (lineageWatch.startRealign): the input subscribes again to it after
// the last shared id, to realign by stream time.
var errRealign = errors.New("dcaa: upstream replica numbers its stable ids otherwise: resubscribing to realign by stream time")

// errReplaced ends a subscription whose batch the machine ignored: it had
// moved the input to another attempt (see dcaa.Deliver.Attempt).
var errReplaced = errors.New("dcaa: subscription replaced by the machine")

// heartbeat passes a heartbeat's state to the machine; dropped when the
// machine is busy (then other events keep it informed). Only a heartbeat
// (a message without tuples) carries its tentative watermark to the
// machine: a batch's watermark covers the batch's own tuples, which reach
// the machine with it (deliver); handed over before them, it let the
// machine release past tuples it had not got yet, and then drop them as
// late (with max_delay 0, nearly every tentative tuple of a downstream
// task).
func (d *dcaaRun) heartbeat(in *input, st fedstreampb.ReplicaState, wm int64, beat bool) {
	if !beat {
		return // the batch's own delivery follows
	}
	select {
	case d.events <- dcaaEvent{ev: dcaa.Deliver{Input: in.idx, Upstream: dcaa.StateFromProto(st), TentWatermark: wm, Attempt: in.machineAttempt.Load()}, ended: -1}:
	default:
	}
}

// replicasMoved tells the machine of every upstream replica the
// coordinator placed anew (another worker or generation than in old, the
// placements before): what the machine knew of the old copy, how often
// its subscriptions failed included, no longer holds (dcaa.ReplicaMoved).
// Each is posted from a goroutine of its own, which the task's context
// ends: the caller is the runtime's Apply, which must not wait for the
// machine.
func (d *dcaaRun) replicasMoved(old map[placeKey][]Placement) {
	t := d.t
	for _, in := range t.inputsNow() {
		for _, was := range old[placeKey{in.upstream, in.upPartition}] {
			now, ok := t.replicaPlacement(in.upstream, in.upPartition, was.Replica)
			if !ok || now.WorkerAddr == was.WorkerAddr && now.Generation == was.Generation {
				continue
			}
			ev := dcaaEvent{ev: dcaa.ReplicaMoved{Input: in.idx, Replica: was.Replica}, ended: -1}
			go func() { _ = d.post(t.ctx, ev) }()
		}
	}
}

// run is the task's process goroutine in machine mode.
func (d *dcaaRun) run(ctx context.Context) {
	t := d.t
	// Under proc: a rescale step may already hold the machine or give it
	// inputs (a copy started during a rescale).
	if err := t.lockProc(ctx); err != nil {
		return
	}
	err := d.do(ctx, d.m.Start(d.now()))
	t.unlockProc()
	if err != nil {
		t.endWith(err)
		return
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	detect := t.detectTimeout()
	for {
		// Under proc: a rescale's hold or cut (setCut, holdForRescale)
		// changes the machine from another goroutine, under proc, and
		// pokes this one to read the deadline again.
		if err := t.lockProc(ctx); err != nil {
			return
		}
		// The producer installs a plan setReconfig could not (the token
		// was busy; it poked this goroutine then). No other place of
		// machine mode looks for one: without this, a replica busy when
		// the plan came never acknowledged it, holding the plan in
		// loading for good.
		if err := d.pollReconfig(); err != nil {
			t.unlockProc()
			t.endWith(err)
			return
		}
		deadline := d.m.NextDeadline()
		t.unlockProc()
		wait := time.Duration(deadline - d.now())
		if wait > time.Hour {
			wait = time.Hour
		}
		timer.Reset(max(wait, 0))
		var ev dcaa.Event = dcaa.Tick{}
		var processed chan struct{}
		var took *tookIDs
		select {
		case <-ctx.Done():
			return
		case e := <-d.events:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			if e.ended >= 0 {
				d.setEnded(e.ended)
				continue
			}
			ev = d.take(e)
			processed, took = e.processed, e.took
		case <-timer.C:
			// A deadline passed: events that arrived meanwhile go
			// first (the inputs may be alive; this goroutine was busy).
			select {
			case e := <-d.events:
				if e.ended >= 0 {
					d.setEnded(e.ended)
					continue
				}
				ev = d.take(e)
				processed, took = e.processed, e.took
			default:
			}
		}
		if err := t.lockProc(ctx); err != nil {
			return
		}
		err := d.step(ctx, ev, took, deadline, detect)
		f := d.m.Figures()
		d.shed.Store(f.Shed)
		d.silences.Store(f.Silences)
		d.countShed(f.ShedData)
		d.keptMax.Store(uint64(f.KeptMax))
		d.limit.Store(int64(d.m.DetectLimit()))
		d.noteWaiting()
		t.unlockProc()
		if processed != nil {
			close(processed)
		}
		if err != nil {
			t.endWith(err)
			return
		}
		if d.done {
			t.setState(StateRunning, "input exhausted")
			d.finished(ctx)
			return
		}
	}
}

// countShed adds the stable input tuples the machine shed for its
// KeepLimit since the last call to the task's InTuples (see release):
// released tentatively only, they are never released stable. The run
// goroutine only.
func (d *dcaaRun) countShed(total uint64) {
	if total > d.shedCounted {
		d.t.counters.in.Add(total - d.shedCounted)
		d.shedCounted = total
	}
}

// setEnded notes that input i delivered its final boundary (the run
// goroutine only, which owns d.ended: a rescale adds inputs, and the
// slice grows here).
func (d *dcaaRun) setEnded(i int) {
	for len(d.ended) <= i {
		d.ended = append(d.ended, false)
	}
	d.ended[i] = true
}

// isEnded reports whether input i delivered its final boundary (the run
// goroutine only).
func (d *dcaaRun) isEnded(i int) bool { return i < len(d.ended) && d.ended[i] }

// finished serves the machine's events once its output ended: a replica
// that has finished never reconciles again, so it grants every peer's
// request at once (a peer still correcting its end of the stream would
// otherwise wait for the permission timeout), and hands back whatever
// else comes (an input's last delivery) without looking at it.
func (d *dcaaRun) finished(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-d.events:
			if e.reply != nil {
				e.reply <- true
			}
			if e.took != nil && d.t.lockProc(ctx) == nil {
				// A batch that came after the end: taken as before the
				// machine finished (under proc, as every look at it).
				if d.takes(e.took) {
					d.record(e.took)
				}
				d.t.unlockProc()
			}
			if e.processed != nil {
				close(e.processed)
			}
		}
	}
}

// step hands one event to the machine and carries out its actions; the
// caller holds proc (a snapshot sees the machine between two events).
// took, when not nil, is the event's batch (see tookIDs).
func (d *dcaaRun) step(ctx context.Context, ev dcaa.Event, took *tookIDs, deadline int64, detect time.Duration) error {
	if d.t.halted.Load() {
		return nil // stop-and-copy: nothing more is processed
	}
	if late := d.now() - deadline; late > int64(detect/2) {
		// Woken long after the deadline: this process could not run
		// for a while (its timer ran late), and what its inputs did not
		// hear meanwhile says nothing of the upstreams. That is
		// starvation, as the watchdog's late timer is: on the
		// starvation clock, it is not counted as their silence
		// (input.silence), which confirmHeard below vouches by, within
		// the wall cap. Before, every live input was taken as just
		// heard, without a cap: at load 45 a held replica went
		// undetected for about 5 s.
		d.t.log.Debug("DCAA machine woke late", "late", time.Duration(late))
		d.t.r.starve().note(time.Now().UnixNano(), late)
	}
	if d.now() >= deadline {
		// A timeout may fire. The machine hears an input only when it
		// takes the input's events, which it does not while this
		// goroutine is busy (a long release, an output waiting for room
		// downstream): first tell it of every input that its own
		// subscription heard within the detection timeout (or that is
		// handing it a batch), so that only inputs silent on the wire
		// time out.
		d.confirmHeard(detect)
	}
	now := d.now()
	// An input that delivered its final boundary is complete, not
	// silent: keep it alive for the machine.
	for i, e := range d.ended {
		if e {
			if err := d.do(ctx, d.m.Step(now, dcaa.Deliver{Input: i, Upstream: dcaa.Stable})); err != nil {
				return err
			}
		}
	}
	taking := d.takes(took)
	acts := d.m.Step(now, ev)
	if taking {
		d.record(took)
	}
	return d.do(ctx, acts)
}

// confirmHeard vouches to the machine (Machine.Alive, all inputs before
// any timeout runs) for every input which its subscription heard from
// within its silence limit (a batch or a heartbeat, see heardFrom; the
// machine's DetectLimit, or the start grace while no replica was heard),
// or which is handing the task a batch.
func (d *dcaaRun) confirmHeard(detect time.Duration) {
	wall, now := time.Now().UnixNano(), d.now()
	for i, in := range d.t.inputs {
		if !d.isEnded(i) && in.heardWithin(wall, time.Duration(in.silenceLimit(detect))) {
			d.m.Alive(i, now)
		}
	}
}

// heardWithin reports whether the input's live subscription, reading the
// replica the machine chose, heard its replica within detect of wall
// (unix nanoseconds; not counting the time this process was starved, see
// input.silence) or is handing the task a batch.
func (in *input) heardWithin(wall int64, detect time.Duration) bool {
	in.mu.Lock()
	live := in.cancelCur != nil && in.machineAttempt.Load() == in.target.attempt
	in.mu.Unlock()
	if !live || in.health.silent.Load() {
		return false
	}
	return in.health.busy.Load() || in.silence(wall) <= int64(detect)
}

// take unpacks an event, noting where a permission request's answer goes.
func (d *dcaaRun) take(e dcaaEvent) dcaa.Event {
	if req, ok := e.ev.(dcaa.PermissionRequest); ok && e.reply != nil {
		d.replyTo[req.From] = e.reply
	}
	return e.ev
}

// do carries out the machine's actions in order.
func (d *dcaaRun) do(ctx context.Context, acts []dcaa.Action) error {
	t := d.t
	for i, a := range acts {
		switch a := a.(type) {
		case dcaa.Subscribe:
			if a.Attempt > 1 {
				// Each move is a failure the machine detected (or a
				// better replica it found): under load, the trail of
				// false detections.
				in, f, wall := t.inputs[a.Input], d.m.Figures(), time.Now().UnixNano()
				t.log.Info("DCAA input moves to upstream replica", "input", in.upstream, "partition", in.upPartition, "replica", a.Replica,
					"attempt", a.Attempt, "silences", f.Silences, "doubts", f.Doubts, "detect_limit", d.m.DetectLimit(), "health", d.m.Health(),
					"silence_wall", time.Duration(wall-in.health.heard.Load()), "silence_run", time.Duration(in.silence(wall)))
			}
			if a.Promoted {
				// The machine took the input's stable ids up to AfterID
				// from its background subscription (dcaa_background.go):
				// the input's, though no main subscription delivered them.
				// Its lineage is the shared one: a background replica
				// whose ids diverged is never read (dcaa_background.go).
				t.inputs[a.Input].setTaken(dataplane.StableTag{ID: a.AfterID})
				d.promotions.Add(1)
				t.log.Info("DCAA input took a stabilizing upstream replica's corrections in the background and moves to it",
					"input", t.inputs[a.Input].upstream, "partition", t.inputs[a.Input].upPartition, "replica", a.Replica, "after_id", a.AfterID)
			}
			t.inputs[a.Input].retarget(a.Replica, a.AfterID, a.Attempt)
		case dcaa.SubscribeBackground:
			d.startBackground(a)
		case dcaa.StopBackground:
			d.stopBackground(a)
		case dcaa.Checkpoint:
			snap, err := t.op.Snapshot()
			if err != nil {
				return fmt.Errorf("dcaa checkpoint of %s: %w", t.node.Name, err)
			}
			d.checkpoint, d.ckptSeq = snap, t.seq
		case dcaa.Release:
			if err := d.release(ctx, a, recDoneIn(acts[i+1:])); err != nil {
				return err
			}
		case dcaa.Restore:
			if a.LostTo > a.LostFrom {
				d.lost(a)
			}
			if err := d.restore(ctx); err != nil {
				return err
			}
			if a.LostTo > a.LostFrom {
				// After the UNDO (which never takes it back): the
				// consumers learn which results stay as the replay makes
				// them.
				if err := d.putUncorrectable(ctx, d.lostFrom.Load(), d.lostTo.Load()); err != nil {
					return err
				}
			}
		case dcaa.RecDone:
			if d.recDoneSent {
				// Sent before the final boundary (see release).
				d.recDoneSent = false
				continue
			}
			if err := d.mark(ctx, tuple.RecDone); err != nil {
				return err
			}
		case dcaa.StateChange:
			t.log.Info("replica state", "from", a.From.String(), "to", a.To.String())
			d.advertise()
		case dcaa.AskPermission:
			d.messagePeers(a.Peers, false)
		case dcaa.NotifyDone:
			d.messagePeers(a.Peers, true)
		case dcaa.ReplyPermission:
			if ch := d.replyTo[a.To]; ch != nil {
				ch <- a.Granted
				delete(d.replyTo, a.To)
			}
		}
	}
	return nil
}

// advertise publishes the replica state and tentative progress on the
// outputs and in the task's report.
func (d *dcaaRun) advertise() {
	st := d.m.State().Proto()
	wm := int64(0)
	if d.m.Tentative() {
		wm = d.tentWM
	}
	d.t.replicaState.Store(int32(st))
	d.t.tentative.Store(d.m.Tentative())
	for _, o := range d.t.outs {
		o.buf.SetStreamState(st, wm)
	}
}

// recDoneIn reports whether acts hold a RecDone.
func recDoneIn(acts []dcaa.Action) bool {
	for _, a := range acts {
		if _, ok := a.(dcaa.RecDone); ok {
			return true
		}
	}
	return false
}

// release processes merge steps: the tuples through the operator, then
// Advance, then (stable steps only) a boundary on every output.
//
// The task's figures (TaskStats): BusyNanos counts every release,
// tentative and replayed ones too (that is work done), less the time
// the outputs blocked it. InTuples counts each stable input tuple once,
// when it is released stable: in a stable step, or in the replay of a
// correction (the stable steps after a checkpoint were all released
// tentatively, never stable, and a replay is never replayed again).
// Tentative releases count nothing: their tuples are either tentative
// input, which the producer's corrections replace by stable tuples
// counted when those are released, or stable input kept for the replay,
// counted there. Stable input shed for the bound on what a replay keeps
// (released tentatively, never replayed) is counted when it is shed
// (countShed). So over a failure and its correction InTuples adds up
// to the stable input, as a failure-free run's would; during a
// tentative phase it stands still and catches up at the replay.
//
// Nothing follows a stream's final boundary: consumers take a batch
// ending with it for the end of the stream (sinks, DCAA inputs, tail).
// So when a replay's corrections reach the final boundary and the
// machine ends them (recDone: a RecDone follows this release), REC_DONE
// goes out just before the final boundary instead of after it.
func (d *dcaaRun) release(ctx context.Context, rel dcaa.Release, recDone bool) error {
	t := d.t
	// The health manager's sensors: a replicated task counts its input
	// and busy time here, as processOne does for the others (without it
	// every operator of a query with replicas >= 2 reported 0 tuples/s at
	// 0% busy, and DS2 could not size it).
	start, blocked := time.Now(), t.blockedNanos()
	defer func() {
		t.counters.busy.Add(max(0, int64(time.Since(start))-(t.blockedNanos()-blocked)))
	}()
	if !rel.Tentative {
		// Counted before the operators see them (one passing a tuple on
		// may change it). See the rule above.
		n := 0
		for _, st := range rel.Steps {
			n += st.Len()
		}
		t.counters.in.Add(uint64(n))
		if t.node.Kind == queryspec.KindSink {
			t.counters.out.Add(uint64(n)) // a sink passes its input on as its result
		}
	}
	d.emitType = tuple.Stable
	if rel.Tentative {
		d.emitType = tuple.Tentative
		if d.m.State().Proto() != fedstreampb.ReplicaState(d.t.replicaState.Load()) {
			// The state goes out before the first tentative tuple (the
			// StateChange action comes after the release): a release
			// that waits for room downstream sent tentative tuples
			// while its consumers still read this replica as STABLE,
			// and a consumer that relays acks to the other replicas
			// kept holding them (pauseRelays).
			d.advertise()
		}
		// Everything appended from now until the UNDO is outside the
		// stable view: say so before any of it can be sent (see
		// dataplane.OutputBuffer.MarkNonStable).
		d.growOutputs()
		for i, o := range t.outs {
			if !d.nsOpen[i] {
				o.buf.BeginNonStable(o.w.LastID() + 1)
				d.nsOpen[i] = true
			}
		}
	}
	em := operator.EmitFunc(func(tp *tuple.Tuple) {
		tp.Type = d.emitType
		t.emitData(ctx, tp)
	})
	for _, st := range rel.Steps {
		for _, run := range st.Runs {
			port := t.inputs[run.Input].port
			for k := range run.Tuples {
				if err := t.op.Process(port, &run.Tuples[k], em); err != nil {
					if !errors.Is(err, operator.ErrEval) {
						return fmt.Errorf("operator %s: %w", t.node.Name, err)
					}
					t.dropped(err)
				}
				if t.emitErr != nil {
					return t.emitErr
				}
			}
		}
		if err := t.op.Advance(st.Advance, em); err != nil {
			return fmt.Errorf("operator %s: advance to %d: %w", t.node.Name, st.Advance, err)
		}
		if t.emitErr != nil {
			return t.emitErr
		}
		if rel.Tentative {
			d.tentWM = max(d.tentWM, st.Advance)
			continue
		}
		if st.Advance == finalBoundary && recDone {
			if err := d.mark(ctx, tuple.RecDone); err != nil {
				return err
			}
			d.recDoneSent = true
		}
		t.reconfigStep(st.Advance)
		if err := t.emitBoundary(ctx, st.Advance); err != nil {
			return err
		}
		if st.Advance == finalBoundary {
			d.done = true
			t.endReconfig()
		}
	}
	if err := t.flush(ctx); err != nil {
		return err
	}
	if rel.Tentative {
		d.tentSteps.Add(uint64(len(rel.Steps)))
		d.advertise()
		return nil
	}
	d.growOutputs()
	for i, o := range t.outs {
		d.lastStable[i] = o.w.LastID()
	}
	return nil
}

// growOutputs follows outputs a rescale added (to new partitions of a
// downstream fragment, from its cut on): nothing on them is stable yet.
func (d *dcaaRun) growOutputs() {
	for len(d.lastStable) < len(d.t.outs) {
		d.lastStable = append(d.lastStable, 0)
		d.nsOpen = append(d.nsOpen, false)
	}
}

// lost notes a correction that cannot make every result exact: the
// stable input in [a.LostFrom, a.LostTo) went for the bound on what a
// replay keeps. Results that depended on it (for a windowed operator,
// those of windows that overlap the range) keep what the replay gives
// them; the task's status says which from now on, and the worker logs
// it.
func (d *dcaaRun) lost(a dcaa.Restore) {
	t := d.t
	to := a.LostTo
	if w := windowOf(t.node); w > 0 && to < math.MaxInt64-int64(w) {
		to += int64(w) // windows that began before LostTo end up to W later
	}
	note := uncorrectableNote(a.LostFrom, to, fmt.Sprintf("a failure outlasted the input kept for the replay (%d tuples)", t.r.opts.DCAAKeepTuples))
	t.log.Warn("DCAA correction incomplete", "from", a.LostFrom, "to", to, "keep_tuples", t.r.opts.DCAAKeepTuples)
	d.lostFrom.Store(a.LostFrom)
	d.lostTo.Store(to)
	t.stateMu.Lock()
	t.uncorrected = note
	t.stateMu.Unlock()
}

// windowOf is the window size of a windowed operator (0 otherwise).
func windowOf(n *queryspec.Node) time.Duration {
	if n == nil || n.Op == nil || n.Op.Window == nil {
		return 0
	}
	d, err := time.ParseDuration(n.Op.Window.Size)
	if err != nil {
		return 0
	}
	return d
}

// restore puts the operator back to the checkpoint and takes back, on
// every output, everything after its last stable tuple (UNDO).
func (d *dcaaRun) restore(ctx context.Context) error {
	t := d.t
	if err := t.op.Restore(d.checkpoint); err != nil {
		return fmt.Errorf("dcaa restore of %s: %w", t.node.Name, err)
	}
	t.seq = d.ckptSeq
	d.restores.Add(1)
	d.tentWM = 0
	return d.mark(ctx, tuple.Undo)
}

// mark appends an UNDO (target: each stream's last stable position, in
// STime) or a REC_DONE to every output and flushes.
func (d *dcaaRun) mark(ctx context.Context, typ tuple.Type) error {
	t := d.t
	d.growOutputs()
	for i, o := range t.outs {
		mk := tuple.Tuple{Type: typ}
		if typ == tuple.Undo {
			mk.STime = int64(d.lastStable[i])
		}
		// The marker is outside the stable view; an UNDO ends the range
		// the tentative tuples opened.
		if next := o.w.LastID() + 1; d.nsOpen[i] {
			o.buf.EndNonStable(next)
			d.nsOpen[i] = false
		} else {
			o.buf.MarkNonStable(next, next)
		}
		if err := t.appendTo(ctx, o, &mk); err != nil {
			return err
		}
	}
	if err := t.flush(ctx); err != nil {
		return err
	}
	if typ == tuple.RecDone {
		// REC_DONE is not stable data, but nothing after it is taken
		// back by a later UNDO either: the stream is stable up to it.
		for i, o := range t.outs {
			d.lastStable[i] = o.w.LastID()
		}
	}
	d.advertise()
	return nil
}

// retarget makes the input read replica r after id after (the machine's
// Subscribe, its attempt number attempt): the live attempt is cancelled
// (the machine ignores what it still delivers).
func (in *input) retarget(r int, after, attempt uint64) {
	in.mu.Lock()
	in.target = dcaaTarget{set: true, replica: r, after: after, attempt: attempt, seq: in.target.seq + 1}
	if in.cancelCur != nil {
		in.cancelCur()
		in.cancelCur = nil
	}
	in.mu.Unlock()
	select {
	case in.targetWake <- struct{}{}:
	default:
	}
}

// runMachine is input.run in machine mode: it reads the replica the
// machine chose and reports failed subscriptions to it, which chooses
// again.
func (in *input) runMachine(ctx context.Context, d *dcaaRun) {
	opts := in.t.r.opts
	log := in.t.log.With("upstream", in.upstream, "upstream_partition", in.upPartition)
	backoff := retry.Policy{Initial: opts.RetryMin, Max: opts.RetryMax}.New()
	// ran is the last attempt subscribed: the machine's AfterID is where
	// that attempt starts, not where a retry of it resumes.
	var ran uint64
	// refused counts the subscriptions in a row that failed without
	// delivering anything (reported to the machine as
	// SubscriptionFailed). The machine moves at once to another replica
	// on such a failure (a killed replica costs no wait); when that one
	// refuses too, the next attempt waits the backoff first. Before, two
	// replicas refusing at once (a copy's upstreams not ready for it yet)
	// made the input subscribe about 1800 times a second, each refusal
	// retargeting it at once, in a process already short of CPU.
	refused := 0
	for ctx.Err() == nil {
		if refused >= 2 && !sleepCtx(ctx, backoff.Next()) {
			return
		}
		// A wake-up posted before the target is read below is for that
		// target: drained, it cannot later run the same attempt again at
		// once, as if the machine had retargeted (a retarget after the
		// read posts a new one).
		select {
		case <-in.targetWake:
		default:
		}
		in.mu.Lock()
		tg := in.target
		in.mu.Unlock()
		if !tg.set {
			select {
			case <-in.targetWake:
				continue
			case <-ctx.Done():
				return
			}
		}
		var err error
		pl, ok := in.t.replicaPlacement(in.upstream, in.upPartition, tg.replica)
		if !ok {
			err = fmt.Errorf("no placement known for %s partition %d replica %d", in.upstream, in.upPartition, tg.replica)
		} else {
			switch {
			case in.lw.re.on && in.lw.attempt == tg.attempt:
				// Realigning (deliver): the same replica again, from
				// the last stable id both numberings share.
				in.sub.ResumeAfter(in.lw.re.resumeAt)
			case in.lw.re.on:
				// A new attempt ended the realignment: it resumes after
				// the machine's last stable id, and its first batch is
				// checked again.
				in.lw.re.on = false
				in.sub.ResumeAfter(tg.after)
			case tg.attempt != ran && (ran != 0 || tg.after <= in.sub.LastID()):
				// A new attempt resumes after the machine's last stable
				// id, as a stable id: on a replica that went tentative
				// before it, the input reads that replica's tentative
				// tail (dataplane.OutputBuffer.ResumePosition) and the
				// machine keeps what lies past the stream time it took
				// (dcaa's stableCovers). The subscriber's position may
				// lie below that id once it read such a tail: then too
				// (a first attempt, a copy's, keeps the position it
				// has). A retry of the same attempt (the machine had
				// not chosen again yet) resumes where the subscriber
				// is: set back to the AfterID of the attempt's start,
				// it rewound past what it took since, and the
				// machine's next attempt then read another replica
				// from there too: from before what that replica had
				// discarded as acknowledged by this input's relay,
				// where it waited for ever, hearing heartbeats
				// (TestDCAAInputResumedPastTheReplicasEndEnds under
				// load).
				in.sub.ResumeAfterStableTagged(in.takenTag(tg.after))
			}
			ran = tg.attempt
			in.machineAttempt.Store(tg.attempt)
			var progressed bool
			progressed, _, err = in.attempt(ctx, pl)
			if err == nil || errors.Is(err, errTaskEnded) {
				return
			}
			if errors.Is(err, errRealign) {
				backoff.Reset()
				continue
			}
			if errors.Is(err, dataplane.ErrEndedBefore) && in.lw.realignBlind() {
				log.Warn("upstream replica's stream ended at or before the position this input resumed from (its replicas number their stable streams differently after a correction that could not be made exact): realigning on it by stream time from its start",
					"replica", tg.replica, "after_id", tg.after)
				in.lw.attempt = tg.attempt // the same attempt: see deliver's fresh
				backoff.Reset()
				continue
			}
			if errors.Is(err, dataplane.ErrEndedBefore) {
				log.Warn("upstream replica's stream ended at or before the position this input resumed from (its replicas number their stable streams differently after a correction that could not be made exact): taken as the end of the input",
					"replica", tg.replica, "after_id", tg.after)
				if derr := d.deliver(ctx, in, endBatch(in.stableTaken.Load())); errors.Is(derr, dataplane.ErrStopSubscription) {
					return
				}
			}
			if progressed {
				backoff.Reset()
				refused = 0
			}
		}
		if ctx.Err() != nil {
			return
		}
		in.mu.Lock()
		retargeted := in.target.seq != tg.seq
		in.mu.Unlock()
		if retargeted {
			continue // the machine chose another replica meanwhile
		}
		refused++
		log.Debug("subscription failed; the machine chooses again", "err", err, "replica", tg.replica)
		if d.post(ctx, dcaaEvent{ev: dcaa.SubscriptionFailed{Input: in.idx, Attempt: tg.attempt}, ended: -1}) != nil {
			return
		}
		select {
		case <-in.targetWake:
		case <-ctx.Done():
			return
		case <-time.After(backoff.Next()):
		}
	}
}

// capture fills a task snapshot's merge part from the machine (the
// caller holds proc): the release watermark and, per input, the last
// stable id taken, the stable boundaries above the watermark and the
// stable data not yet released. A replica holding tentative state is not
// captured (a copy could not correct it): ErrNotSnapshottable until it is
// stable again.
func (d *dcaaRun) capture(s *TaskSnapshot) error {
	released, ins, err := d.m.Capture()
	if errors.Is(err, dcaa.ErrNotCapturable) {
		return fmt.Errorf("%w: %s: %v", errTentativeNow, d.t.spec.TaskID, err)
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNotSnapshottable, d.t.spec.TaskID, err)
	}
	s.Released = released
	s.Inputs = s.Inputs[:0]
	for i, c := range ins {
		in := d.t.inputs[i]
		s.Inputs = append(s.Inputs, InputPosition{Upstream: in.upstream, Port: in.port, Partition: in.upPartition,
			After: c.LastStable, Boundary: c.StableBoundary, Steps: c.Steps, Pending: c.Pending})
	}
	return nil
}

// resume starts the machine from a task snapshot (before the task starts).
func (d *dcaaRun) resume(s *TaskSnapshot) error {
	ins := make([]dcaa.InputCapture, len(s.Inputs))
	for i, p := range s.Inputs {
		ins[i] = dcaa.InputCapture{LastStable: p.After, StableBoundary: p.Boundary, Steps: p.Steps, Pending: p.Pending}
	}
	return d.m.Resume(s.Released, ins)
}

// pollReconfig installs a pending reconfiguration, as processOne does
// before each release outside machine mode (the caller holds proc). A
// halted task processes nothing more; an ended one installs plans off
// the producer (installEnded).
func (d *dcaaRun) pollReconfig() error {
	if d.t.halted.Load() || d.t.rc.ended.Load() {
		return nil
	}
	return d.t.pollReconfig()
}

// poke wakes the run goroutine (a cut was set or lifted: the machine may
// release now). A full event queue wakes it anyway.
func (d *dcaaRun) poke() {
	select {
	case d.events <- dcaaEvent{ev: dcaa.Tick{}, ended: -1}:
	default:
	}
}

// holdForRescale holds the machine where it is for a rescale of fragment
// f to epoch (see task.hold) and returns its release watermark. A replica
// whose operators hold tentative state cannot hand state on at a cut, so
// the hold waits (logged once) until the replica is stable again, as
// long as that rescale is still the one prepared; ok is false when the
// wait ends otherwise (ctx done, the rescale aborted or replaced).
func (d *dcaaRun) holdForRescale(ctx context.Context, f string, epoch uint64) (released int64, ok bool) {
	t := d.t
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	waited := false
	for {
		if err := t.lockProc(ctx); err != nil {
			return 0, false
		}
		err := d.m.SetCut(d.m.Released())
		released = max(d.m.Released(), t.maxSTime)
		t.unlockProc()
		if err == nil {
			if waited {
				t.log.Info("rescale: replica stable again; holding", "fragment", f, "epoch", epoch)
			}
			return released, true
		}
		if !errors.Is(err, dcaa.ErrNotStable) {
			t.log.Error("rescale: this DCAA task cannot hold", "fragment", f, "epoch", epoch, "err", err)
			return 0, false
		}
		if !waited {
			t.log.Warn("rescale: this replica holds tentative results; the hold waits until it is stable again", "fragment", f, "epoch", epoch, "err", err)
			waited = true
		}
		if mp := t.rs.maps.Load(); mp == nil || (*mp)[f] == nil || (*mp)[f].Next == nil || (*mp)[f].Next.Epoch != epoch {
			t.log.Info("rescale: no longer prepared while waiting to hold", "fragment", f, "epoch", epoch)
			return 0, false
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-tick.C:
		}
	}
}

// rank is the input's place among the machine's inputs for tuples of
// equal stream time: by port, then upstream partition, as the stable
// merge orders them (mergeOrder), whatever order a rescale added the
// inputs in.
func (in *input) rank() int64 { return int64(in.port)<<32 | int64(in.upPartition) }

// addInputs gives the machine the inputs a rescale added, in order (their
// indexes follow the task's inputs), their streams starting at cut, and
// subscribes them. The caller holds proc, and the machine is held below
// the cut (the rescale's hold), so the machine released nothing its
// added inputs carry.
func (d *dcaaRun) addInputs(added []*input, cut int64) error {
	for _, in := range added {
		i, acts, err := d.m.AddInput(d.now(), max(1, d.t.plan.Query.Replicas), cut, in.rank())
		if err != nil {
			return err
		}
		if i != in.idx {
			return fmt.Errorf("dcaa: added input %s partition %d is input %d of the machine, %d of the task", in.upstream, in.upPartition, i, in.idx)
		}
		in.targetWake = make(chan struct{}, 1)
		for _, a := range acts {
			if s, ok := a.(dcaa.Subscribe); ok {
				in.retarget(s.Replica, s.AfterID, s.Attempt)
			}
		}
	}
	d.wait.grow(d.m.Inputs())
	return nil
}

// setCut sets (or, with math.MaxInt64, lifts) the machine's cut and wakes
// it; the caller holds proc.
func (d *dcaaRun) setCut(cut int64) error {
	err := d.m.SetCut(cut)
	d.poke()
	return err
}

// stableIDs renumbers a batch's stable tuples and boundaries by stable id
// (the count of the stream's stable tuples and boundaries up to each:
// its position less the positions outside the stable view before it,
// which the producer sends as the batch's offset) and returns the stable
// id of the stream's last stable tuple up to the batch's end. One pass,
// from the end.
//
// Replicas of an upstream number their streams alike only until one of
// them corrects its output (tentative tuples, UNDO, REC_DONE take
// positions on that replica alone); stable ids stay alike. The machine
// keeps, resumes from and acknowledges to other replicas by stable id, so
// a switch to another replica after a correction neither skips nor
// repeats a stable tuple: the subscription resumes at the stable id as a
// position (never beyond the replica's position of that stable id, which
// is at least the id), the tuples up to that stable id are dropped as
// duplicates, and an ack relayed to another replica acknowledges only
// positions at or before it there.
func stableIDs(b *dataplane.Batch) (uint64, error) {
	last, _, err := renumberStable(b)
	return last, err
}

// renumberStable is stableIDs that also reports whether the batch holds
// the stream's final boundary.
func renumberStable(b *dataplane.Batch) (last uint64, final bool, err error) {
	if b.Offset > b.LastID {
		return 0, false, fmt.Errorf("%w: position offset %d beyond the last id %d", dataplane.ErrProtocol, b.Offset, b.LastID)
	}
	last = b.LastID - b.Offset
	s := last
	for k := len(b.Tuples) - 1; k >= 0; k-- {
		tp := &b.Tuples[k]
		if tp.Type != tuple.Stable && tp.Type != tuple.Boundary {
			continue
		}
		if s == 0 {
			n := 0
			for j := range b.Tuples {
				if t := b.Tuples[j].Type; t == tuple.Stable || t == tuple.Boundary {
					n++
				}
			}
			return 0, false, fmt.Errorf("%w: %d stable tuples in a batch whose stable id ends at %d", dataplane.ErrProtocol, n, last)
		}
		tp.ID = s
		s--
		if tp.Type == tuple.Boundary && tp.STime == finalBoundary {
			final = true
		}
	}
	return last, final, nil
}
