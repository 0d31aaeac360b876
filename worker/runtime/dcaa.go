package runtime

import (
	"context"

	"errors"
	"github.com/fedstream/fedstream/config/queryspec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dcaa"
)

// DCAA wiring (issue 10; see docs/DATAPLANE.md). A query with replicas
// runs every output stream with heartbeats and its replica state in band,
// and every input with failure detection: an input that hears nothing
// from the upstream replica it reads (no batch, no heartbeat) for the
// detection timeout takes that replica for failed and moves to another,
// as it does when a subscription fails. The task's replica state is
// UP_FAILURE while one of its inputs is failed (silent and not yet heard
// from the next replica) or reads a replica that advertises UP_FAILURE or
// STABILIZATION, STABLE otherwise; it is advertised on the task's outputs
// and reported with the task's state.

// errSilent ends an attempt whose upstream replica went silent past the
// detection timeout.
var errSilent = errors.New("upstream replica silent past the detection timeout")

// dcaaOn reports whether the task's query runs DCAA (it has replicas).
func (t *task) dcaaOn() bool { return t.plan != nil && t.plan.Query.Replicas > 1 }

// detectTimeout is the silence after which an input counts as failed.
func (t *task) detectTimeout() time.Duration {
	return t.r.opts.DetectTimeout
}

// inputHealth is what failure detection knows of an input's live
// attempt. Written by the subscription's goroutine (heard, upState) and
// the watchdog (silent), read by both.
type inputHealth struct {
	// heard is when the live attempt last heard its upstream replica
	// (unix nanoseconds): a batch or a heartbeat, or the attempt's start.
	// heardRun is the same instant less the time this process was
	// starved before it (see starveClock): silence is measured on that
	// clock. Both are written by hear.
	heard    atomic.Int64
	heardRun atomic.Int64
	// upState and tentWM are the state and tentative watermark the
	// replica read advertises.
	upState atomic.Int32
	tentWM  atomic.Int64
	// silent: the input's last attempt ended for silence and the next
	// one has not heard its replica yet.
	silent atomic.Bool
	// busy: the input is handing a batch to the task (which may wait for
	// room: then the input reads nothing, and that is the task's doing,
	// not the upstream's silence).
	busy atomic.Bool
	// silenced: the watchdog cancelled the live attempt for silence
	// (taken by run, which then moves to another replica).
	silenced atomic.Bool
	// spoke: some replica of the upstream was heard (a batch or a
	// heartbeat) since the task started; until then the watchdog allows
	// dcaa.StartGrace (silenceLimit).
	spoke atomic.Bool
	// onAttempt: the live attempt heard its replica (a batch or a
	// heartbeat) since it started.
	onAttempt atomic.Bool
}

// An input that has heard no replica of its upstream since its task
// started may stay silent dcaa.StartGrace(detect) before the watchdog
// moves it to another replica: the upstream's tasks start on other
// workers at about the same time, and under load one that had not sent
// its first heartbeat yet was taken for failed at once (the machine's
// own detection has the same grace, dcaa.Config.StartGrace). A consumer
// moved so at the start read replica 1 from then on, and
// TestCutLinkBetweenWorkerProcesses' cut of replica 0 met no reader.

// silenceLimit is the silence past which the watchdog takes the live
// attempt's replica for failed: the task's detectLimit once some replica
// was heard.
func (in *input) silenceLimit(detect time.Duration) int64 {
	if !in.health.spoke.Load() {
		return int64(dcaa.StartGrace(detect))
	}
	if d := in.t.dm; d != nil && !in.health.onAttempt.Load() {
		// An attempt not heard yet: the machine's grace for a
		// subscription being set up (dcaa's silenceLimit).
		return int64(max(detect, in.t.detectLimit(), d.detectMax))
	}
	return int64(max(detect, in.t.detectLimit()))
}

// detectLimit is the silence after which an input that was heard counts
// as failed now: the machine's DetectLimit (the detection timeout,
// stretched while this process hears its live upstreams in long gaps),
// or the detection timeout for a task without a machine (a sink).
func (t *task) detectLimit() time.Duration {
	if d := t.dm; d != nil {
		return time.Duration(d.limit.Load())
	}
	return t.detectTimeout()
}

// heardFrom is the input's subscriber's OnStreamState callback.
func (in *input) heardFrom(st fedstreampb.ReplicaState, wm int64, beat bool) {
	in.hear(time.Now().UnixNano())
	in.health.spoke.Store(true)
	in.health.onAttempt.Store(true)
	in.health.upState.Store(int32(st))
	in.health.tentWM.Store(wm)
	in.health.silent.Store(false)
	if d := in.t.dm; d != nil {
		d.heartbeat(in, st, wm, beat)
	}
}

// delivering ends a delivery: the input listens again, counting from now.
func (in *input) delivering() {
	in.hear(time.Now().UnixNano())
	in.health.busy.Store(false)
}

// failed reports whether the input counts as failed for the task's
// replica state.
func (in *input) failed() bool {
	if in.health.silent.Load() {
		return true
	}
	switch fedstreampb.ReplicaState(in.health.upState.Load()) {
	case fedstreampb.ReplicaState_REPLICA_UP_FAILURE, fedstreampb.ReplicaState_REPLICA_STABILIZATION:
		return true
	}
	return false
}

// watch makes failure detection and the in-band state cover in
// (every input of a DCAA task, those a rescale adds too).
func (in *input) watch() {
	in.sub.OnStreamState(in.heardFrom)
	in.watched = true
}

// setupDCAA turns on heartbeats and the in-band state on the task's
// outputs, and the state callback on its inputs. Called by newTask.
func (t *task) setupDCAA() {
	if !t.dcaaOn() {
		return
	}
	t.replicaState.Store(int32(fedstreampb.ReplicaState_REPLICA_STABLE))
	for _, o := range t.outs {
		o.buf.SetHeartbeat(t.r.opts.BoundaryInterval)
		o.buf.SetStreamState(fedstreampb.ReplicaState_REPLICA_STABLE, 0)
	}
	for _, in := range t.inputs {
		in.watch()
	}
	if t.node.Kind == queryspec.KindSink && !t.passThrough {
		// A merging sink: its tentative part (see dcaa_sink.go).
		t.newMergeView()
	}
	if t.usesMachine() {
		d, err := newDCAARun(t)
		if err != nil {
			// The plan was validated: a share cannot fail to split. Keep
			// the stable-only merge rather than fail the task.
			t.log.Error("DCAA machine not started; the task merges its inputs without it", "err", err)
			return
		}
		if s := t.spec.FromSnapshot; s != nil {
			// Without the streams of partitions a finished rescale
			// removed (ended in the snapshot), in the task's order, as
			// restoreFrom took them.
			if err := d.resume(inputsOfTask(s, t)); err != nil {
				t.log.Error("DCAA machine not resumed from the snapshot; the task merges its inputs without it", "err", err)
				return
			}
		}
		t.dm = d
		for _, in := range t.inputs {
			in.targetWake = make(chan struct{}, 1)
		}
	}
}

// watchInputs is the task's failure detector (one goroutine per task
// with inputs in a DCAA query, owned by the task): it cancels an attempt
// whose replica has been silent past the detection timeout and keeps the
// task's replica state current.
func (t *task) watchInputs(ctx context.Context) {
	detect := t.detectTimeout()
	every := max(detect/8, time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := time.Now().UnixNano()
	// bgs counts a sink's background reads (dcaa_sinkbg.go): they end
	// with ctx.
	var bgs sync.WaitGroup
	defer bgs.Wait()
	sinkBg := t.sinkBackgroundOn()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		// This timer running late is this process starving (paused,
		// short of CPU): not counted as the upstreams' silence.
		t.r.starve().note(now, now-last-int64(every))
		if late := now - last; late > int64(detect/2) {
			// This process itself stood still (paused, starved of CPU):
			// what it did not hear meanwhile says nothing of the
			// upstream. Listen afresh.
			for _, in := range t.inputsNow() {
				in.listenAfresh(now)
			}
		}
		last = now
		quiet := t.inputsAllSilent(now, detect)
		for _, in := range t.inputsNow() {
			limit := in.silenceLimit(detect)
			if quiet {
				// Every input silent at once: the machine fails none
				// before HealthMax (dcaa's allSilent), nor does this.
				limit = max(limit, int64(t.dm.healthMax))
			}
			if in.health.busy.Load() || in.silence(now) <= limit {
				continue
			}
			if t.dm != nil && !in.health.spoke.Load() {
				// No replica heard since the start: the machine times
				// the input out itself, its grace growing with each
				// move (dcaa's silenceLimit); cancelled here at a fixed
				// grace, a subscription slow to set up under load never
				// delivered.
				continue
			}
			in.mu.Lock()
			if in.cancelCur != nil {
				t.silences.Add(1)
				t.log.Info("DCAA input silent past the detection timeout: leaving its upstream replica", "input", in.upstream, "partition", in.upPartition,
					"silence_run", time.Duration(in.silence(now)), "silence_wall", time.Duration(now-in.health.heard.Load()), "limit", time.Duration(limit))
				in.health.silenced.Store(true)
				in.health.silent.Store(true)
				in.cancelCur()
				in.cancelCur = nil
			}
			in.mu.Unlock()
		}
		for _, in := range t.inputsNow() {
			in.pauseRelays()
		}
		t.updateReplicaState()
		if sinkBg {
			t.sinkBackgrounds(ctx, &bgs)
		}
	}
}

// inputsAllSilent reports whether the task runs its DCAA machine and
// every input of it (at least two not ended) has been silent past the
// detection timeout at once (dcaa's allSilent, on this side's clock:
// input.silence).
func (t *task) inputsAllSilent(now int64, detect time.Duration) bool {
	if t.dm == nil || t.dm.healthMax <= detect {
		return false
	}
	n := 0
	for _, in := range t.inputsNow() {
		if in.endTaken.Load() {
			continue
		}
		if in.health.busy.Load() || in.silence(now) <= int64(detect) {
			return false
		}
		n++
	}
	return n >= 2
}

// updateReplicaState recomputes the task's replica state from its
// inputs and advertises a change on its outputs. A task run by its DCAA
// machine is left alone: the machine owns its state (it is UP_FAILURE
// while its operators hold tentative state even with every input fine,
// and advertises its tentative watermark with it), and this would
// overwrite it with STABLE and watermark 0 between the machine's own
// advertisements, so consumers saw it flap.
func (t *task) updateReplicaState() {
	if t.dm != nil {
		return
	}
	t.inputsReplicaState()
}

// inputsReplicaState is updateReplicaState for a task without a
// machine (sinks): UP_FAILURE while an input is failed.
func (t *task) inputsReplicaState() {
	st := fedstreampb.ReplicaState_REPLICA_STABLE
	if t.tentative.Load() {
		// A sink whose results are tentative now.
		st = fedstreampb.ReplicaState_REPLICA_UP_FAILURE
	}
	for _, in := range t.inputsNow() {
		if in.failed() {
			st = fedstreampb.ReplicaState_REPLICA_UP_FAILURE
		}
	}
	if old := fedstreampb.ReplicaState(t.replicaState.Swap(int32(st))); old == st {
		return
	} else {
		t.log.Info("replica state", "from", old.String(), "to", st.String())
	}
	for _, o := range t.outs {
		o.buf.SetStreamState(st, 0)
	}
}
