package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/dcaa"
)

// Background corrections for sinks (issue 10: "while the main input is
// tentative it may take corrections from a stabilizing replica in the
// background"). A sink runs no DCAA machine, but its inputs follow the
// machine's rule (worker/dcaa/background.go): while an input reads an
// upstream replica that is tentative (it advertises UP_FAILURE, or the
// sink holds tentative results of it), it also reads another replica of
// that upstream in the background, chosen as the machine chooses
// (dcaa.BackgroundReplica: one known in STABILIZATION first, by its
// background reads or the coordinator's hints, then the nearest number,
// none whose background read failed recently), and
// follows its stream with dcaa.StableAgain. Once that replica is stable
// again (its REC_DONE, or STABLE with nothing tentative since its last
// UNDO or REC_DONE), the input moves its main subscription there.
//
// Unlike the machine, a sink keeps nothing aside: the move is an
// ordinary switch of replica, resuming by stable id (input.run), so the
// corrections come on the main subscription from the new replica's
// buffer, which holds them (the sink's ack relays keep every replica's
// stable output after the sink's stable id), and the sink's own code
// for a switch (an UNDO of what it showed, the corrections, REC_DONE at
// the next stable boundary) applies unchanged. That costs one
// subscription set-up more than keeping aside, and leaves the sinks'
// stable path as it is. Before, the input stayed on its tentative
// replica until that replica corrected itself in turn, after the other
// one's REC_DONE, a permission round between them and its own replay.
//
// The background read acknowledges nothing and starts at the input's
// stable id taken as a position (a no-ack subscriber cannot resume by
// stable id): what it reads first may be older than the sink's stable
// results, a REC_DONE of an earlier failure among it; a REC_DONE read
// while the replica advertises UP_FAILURE does not count (inFailure).

// sinkBg is a DCAA sink input's background reading. The task's
// watchInputs goroutine owns it (sinkBackgrounds); ended and failed are
// set by the reading goroutine, known by both.
type sinkBg struct {
	// known is the state each upstream replica advertised as this input
	// last read it in the background (dcaa.State; index = replica), at
	// knownAt (unix nanoseconds).
	known   []atomic.Int32
	knownAt []atomic.Int64
	// suspect is when each replica's background read last failed.
	suspect []time.Time
	// The running read: its replica, cancel (nil: none), and ended: its
	// goroutine returned (failed: not for a move, nor cancelled).
	replica       int
	cancel        context.CancelFunc
	ended, failed *atomic.Bool
}

// sinkBackgroundOn reports whether the task is a sink of a replicated
// query whose inputs read in the background.
func (t *task) sinkBackgroundOn() bool {
	return t.dm == nil && (t.passDCAA() || t.mv != nil) && !t.r.opts.DCAANoBackground
}

// sinkBackgrounds starts or stops each input's background read (the
// watchInputs goroutine, every tick; wg counts the reading goroutines,
// which end with ctx).
func (t *task) sinkBackgrounds(ctx context.Context, wg *sync.WaitGroup) {
	for _, in := range t.inputsNow() {
		t.sinkBackground(ctx, in, wg)
	}
}

func (t *task) sinkBackground(ctx context.Context, in *input, wg *sync.WaitGroup) {
	k := max(1, t.plan.Query.Replicas)
	if in.sbg == nil {
		in.sbg = &sinkBg{known: make([]atomic.Int32, k), knownAt: make([]atomic.Int64, k), suspect: make([]time.Time, k)}
	}
	s := in.sbg
	now := time.Now()
	if s.cancel != nil && s.ended.Load() {
		if s.failed.Load() {
			s.suspect[s.replica] = now
		}
		s.stop()
	}
	if in.prefer.Load() != 0 {
		return // moved; its next attempt reads that replica
	}
	in.mu.Lock()
	cur := in.current
	in.mu.Unlock()
	if cur.TaskID == "" || !in.sinkTentative() {
		s.stop()
		return
	}
	if s.cancel != nil {
		if s.replica == cur.Replica {
			s.stop() // the input moved there (for a failure, or promoted)
		}
		return
	}
	// What the input knows of each replica: read in the background, or
	// the coordinator's hint when newer (dcaa_hints.go).
	states := make([]dcaa.State, k)
	for r := range states {
		states[r] = dcaa.State(s.known[r].Load())
		if h, ok := t.hints.get(hintKey{in.upstream, in.upPartition, r}); ok && h.at.UnixNano() > s.knownAt[r].Load() {
			states[r] = h.state
		}
	}
	// A replica whose background read failed is not read in the
	// background again for the machine's first suspicion.
	susp := dcaa.Suspicion(t.detectTimeout(), 1)
	r := dcaa.BackgroundReplica(t.spec.Replica, cur.Replica, states, func(r int) bool { return now.Sub(s.suspect[r]) < susp })
	if r < 0 {
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	ended, failed := &atomic.Bool{}, &atomic.Bool{}
	s.replica, s.cancel, s.ended, s.failed = r, cancel, ended, failed
	after := in.stableTaken.Load()
	wg.Add(1)
	// Owned by the watchInputs goroutine (cancel; its ctx ends with the
	// task) and by wg.
	go func() {
		defer wg.Done()
		defer ended.Store(true)
		var again dcaa.StableAgain
		moved := false
		err := t.readInBackground(rctx, in, r, after, func(_ context.Context, b *dataplane.Batch, st dcaa.State) error {
			s.known[r].Store(int32(st))
			s.knownAt[r].Store(time.Now().UnixNano())
			done := again.Observe(b.Tuples, st) && st != dcaa.UpFailure
			b.Release()
			if done {
				moved = in.moveTo(r)
				return dataplane.ErrStopSubscription
			}
			return nil
		})
		if !moved && rctx.Err() == nil {
			failed.Store(true)
			t.log.Debug("DCAA sink background read ended", "input", in.upstream, "partition", in.upPartition, "replica", r, "err", err)
		}
	}()
}

// stop cancels the running background read, if any (its goroutine ends
// on its own).
func (s *sinkBg) stop() {
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
}

// sinkTentative reports whether a DCAA sink's input reads a replica
// whose stream is tentative: it advertises UP_FAILURE, or the sink holds
// tentative results it brought (the machine's inputTentative).
func (in *input) sinkTentative() bool {
	if fedstreampb.ReplicaState(in.health.upState.Load()) == fedstreampb.ReplicaState_REPLICA_UP_FAILURE {
		return true
	}
	t := in.t
	if t.passDCAA() {
		return t.tentative.Load() // its only input's
	}
	mv := t.mv
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return in.idx < len(mv.tent) && len(mv.tent[in.idx]) > 0
}

// moveTo moves the input's main subscription to upstream replica r,
// whose stream is stable again (sinkBackground): the next attempt reads
// it (input.run), resuming by stable id; the live attempt is cancelled
// as for a placement change. It reports false when the input reads r
// already.
func (in *input) moveTo(r int) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.current.Replica == r && in.cancelCur != nil {
		return false
	}
	in.prefer.Store(int32(r + 1))
	if in.cancelCur != nil {
		in.cancelCur()
		in.cancelCur = nil
	}
	in.bgMoves.Add(1)
	in.t.log.Info("DCAA sink input moves to an upstream replica stable again, read in the background", "input", in.upstream, "partition", in.upPartition, "replica", r)
	return true
}

// preferred is the index in cands of the replica a background read
// moved the input to (moveTo), once; -1 when none.
func (in *input) preferred(cands []Placement) int {
	p := in.prefer.Swap(0)
	if p == 0 {
		return -1
	}
	for k, pl := range cands {
		if pl.Replica == int(p-1) {
			return k
		}
	}
	return -1
}
