package dcaa

import (
	"math"
	"slices"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Corrections from a stabilizing replica in the background
// (Config.Background).
//
// An input whose replica is tentative (it advertises UP_FAILURE or
// delivers tentative data) stays on it while every other replica of the
// upstream is no better as far as the input knows (choose): a replica in
// STABILIZATION ranks below UP_FAILURE, and the task hears another
// replica's state only from a coordinator's report (UpstreamStates) or
// by reading it. Without a report the input learns of the correction
// only when its own replica corrects itself in turn, after the other
// one's REC_DONE, a permission round between them and its own replay.
//
// With Background, while the input is tentative the machine also asks
// for a second, background subscription of that input to another
// replica of the upstream (one reported in STABILIZATION first, else
// the nearest number; none suspected or gone quiet), from the input's
// last stable id (SubscribeBackground). What it delivers is kept aside,
// not released: its stable tuples and boundaries (the corrections once
// that replica reconciles, and the stable tuples it had past the input's
// last stable id), never its tentative data nor its UNDO, and its
// advertised state is noted. When its REC_DONE comes, or it advertises
// STABLE with no tentative data since its last UNDO or REC_DONE, the
// input takes what was kept aside as if its main subscription had
// delivered it (ids it has already are dropped as resent), drops the
// tentative data of its old replica it had not released, stops the
// background subscription (StopBackground) and makes that replica its
// main one, after the last stable id it now has (Subscribe, Promoted).
// The task can then reconcile at once: its input is stable and covers
// what it released tentatively. Taking the move at any point is safe:
// the main subscription resumes after what the input took, by stable id.
//
// The choice of replica stays here: the caller runs the subscriptions it
// is asked for and hands back what they deliver, tagged with their
// attempt. The background attempt numbers are apart from the main ones
// (backgroundAttempt set), so a delivery says which subscription it came
// on. A background subscription ends (StopBackground) when the input is
// no longer tentative (its own replica corrected itself first), when the
// input moves to another replica for any reason (switchTo), when it
// fails (its replica becomes suspected, as a main subscription's does),
// and when what it kept aside goes over Config.KeepLimit (the input then
// gets the corrections the old way, and no background subscription
// until it is stable again). Kept aside, stable tuples are copies whose
// values may alias the delivered batch: a background delivery is never
// handed back to its owner (Deliver.Owner; the garbage collector frees
// it).

// backgroundAttempt marks the attempt numbers of background
// subscriptions.
const backgroundAttempt uint64 = 1 << 63

// SubscribeBackground runs a second subscription of Input, to upstream
// replica Replica after stable id AfterID, beside the main one, tagged
// Attempt (its deliveries and failure are passed back with it). It never
// replaces the main subscription; a background subscription the input
// had before was stopped by a StopBackground first.
type SubscribeBackground struct {
	Input, Replica int
	AfterID        uint64
	Attempt        uint64
}

// StopBackground ends input Input's background subscription Attempt;
// what it still delivers is ignored.
type StopBackground struct {
	Input   int
	Attempt uint64
}

func (SubscribeBackground) isAction() {}
func (StopBackground) isAction()      {}

// background is an input's background subscription (attempt 0: none).
type background struct {
	replica int
	attempt uint64
	// lastStable is the last stable id kept aside (or the id the
	// subscription started after).
	lastStable uint64
	// kept holds the stable tuples and boundaries delivered, in order.
	kept []tuple.Tuple
	// again says when its stream is stable again.
	again StableAgain
	// off: what it kept aside went over KeepLimit; no background
	// subscription until the input is stable again.
	off bool
}

// nextBackgroundAttempt numbers a new background subscription (bgSeq
// counts them across the machine's inputs).
func (m *Machine) nextBackgroundAttempt() uint64 {
	m.bgSeq++
	return backgroundAttempt | m.bgSeq
}

// isBackground reports whether attempt is input i's background
// subscription.
func (m *Machine) isBackground(i int, attempt uint64) bool {
	bg := &m.inputs[i].bg
	return attempt&backgroundAttempt != 0 && bg.attempt == attempt
}

// Background is input i's background subscription: the upstream replica
// and attempt (ok false: none).
func (m *Machine) Background(i int) (replica int, attempt uint64, ok bool) {
	bg := m.inputs[i].bg
	return bg.replica, bg.attempt, bg.attempt != 0
}

// inputTentative: input in reads a replica whose stream is tentative.
func (in *inputState) inputTentative() bool {
	return !in.ended() && (in.failedUp || in.tentData)
}

// backgroundCheck starts or stops input i's background subscription
// after an event on it.
func (m *Machine) backgroundCheck(i int, acts []Action) []Action {
	if !m.cfg.Background {
		return acts
	}
	in := m.inputs[i]
	if !in.inputTentative() {
		acts = m.stopBackground(i, acts)
		in.bg.off = false
		return acts
	}
	if in.bg.attempt != 0 || in.bg.off {
		return acts
	}
	r := m.backgroundReplica(in)
	if r < 0 {
		return acts
	}
	in.bg = background{replica: r, attempt: m.nextBackgroundAttempt(), lastStable: in.lastStable}
	m.bgStarts++
	return append(acts, SubscribeBackground{Input: i, Replica: r, AfterID: in.lastStable, Attempt: in.bg.attempt})
}

// backgroundReplica is the replica of input in's upstream to read in
// the background (BackgroundReplica): not one suspected or gone quiet.
func (m *Machine) backgroundReplica(in *inputState) int {
	return BackgroundReplica(m.cfg.ID, in.replica, in.upState, func(r int) bool { return in.quiet[r] || m.suspected(in, r) })
}

// BackgroundReplica is the upstream replica a tentative input reading
// replica read should read in the background, as this replica (self)
// chooses it: not the one it reads nor one skip excludes; one known
// (states, index = replica number) in STABILIZATION first, then the
// nearest number from self. -1 when there is none. The machine's inputs
// and the runtime's sinks (which run no machine) choose so.
func BackgroundReplica(self, read int, states []State, skip func(r int) bool) int {
	k := len(states)
	best := -1
	for d := range k {
		r := (self + d) % k
		if r == read || skip(r) {
			continue
		}
		if states[r] == Stabilization {
			return r
		}
		if best < 0 {
			best = r
		}
	}
	return best
}

// StableAgain follows the stream of a replica read in the background
// and says when it is stable again: its REC_DONE came, or it advertises
// STABLE with no tentative data since its last UNDO or REC_DONE. The
// machine moves an input to that replica then (promote); a sink, which
// runs no machine, resubscribes its input to it.
type StableAgain struct {
	// tentData: tentative data came since its last UNDO or REC_DONE.
	tentData bool
}

// Observe takes one delivery of the replica (its tuples, and the state
// it advertised with them) and reports whether its stream is stable
// again.
func (s *StableAgain) Observe(ts []tuple.Tuple, st State) bool {
	done := false
	for k := range ts {
		switch ts[k].Type {
		case tuple.Tentative:
			s.tentData = true
		case tuple.Undo:
			s.tentData = false
		case tuple.RecDone:
			s.tentData = false
			done = true
		}
	}
	return done || st == Stable && !s.tentData
}

// stopBackground ends input i's background subscription, if any.
func (m *Machine) stopBackground(i int, acts []Action) []Action {
	in := m.inputs[i]
	if in.bg.attempt == 0 {
		return acts
	}
	a := in.bg.attempt
	in.bg = background{}
	return append(acts, StopBackground{Input: i, Attempt: a})
}

// backgroundFailed: input i's background subscription ended with an
// error; its replica is suspected (not read in the background again
// while it is), and another may be read instead.
func (m *Machine) backgroundFailed(i int, acts []Action) []Action {
	in := m.inputs[i]
	in.suspect[in.bg.replica] = m.now
	acts = m.stopBackground(i, acts)
	return m.backgroundCheck(i, acts)
}

// backgroundDeliver keeps aside what input ev.Input's background
// subscription delivered, and makes its replica the input's main one
// once that replica's stream is stable again (see the comment at the top
// of this file).
func (m *Machine) backgroundDeliver(ev Deliver, acts []Action) []Action {
	i := ev.Input
	in := m.inputs[i]
	bg := &in.bg
	in.upState[bg.replica], in.seen[bg.replica] = ev.Upstream, m.now
	in.quiet[bg.replica], in.suspect[bg.replica], in.fails[bg.replica] = false, 0, 0
	for k := range ev.Tuples {
		t := ev.Tuples[k]
		switch t.Type {
		case tuple.Stable:
			if t.ID != 0 && t.ID <= bg.lastStable {
				continue // resent by a retry of the subscription
			}
			bg.lastStable = max(bg.lastStable, t.ID)
			bg.kept = append(bg.kept, t)
		case tuple.Boundary:
			// Kept whatever its id: the input takes it by stream time
			// (see deliver).
			bg.lastStable = max(bg.lastStable, t.ID)
			bg.kept = append(bg.kept, t)
		}
	}
	again := bg.again.Observe(ev.Tuples, ev.Upstream)
	if m.cfg.KeepLimit > 0 && len(bg.kept) > m.cfg.KeepLimit {
		acts = m.stopBackground(i, acts)
		in.bg.off = true
		return acts
	}
	if !again {
		return acts
	}
	return m.promote(i, Stable, acts)
}

// promote makes input i's background replica its main one: the input
// takes the stable tuples kept aside as delivered by it, in state st
// (STABLE once its REC_DONE came or it advertised STABLE; otherwise what
// it advertised last: the input moves there for another reason, see
// switchTo), drops the tentative data of its old replica not released
// yet (as any switch does), and resubscribes to that replica after its
// last stable id. Taken at any point, the move is exact: the stable
// tuples kept aside mean the same on every replica (stable ids), and
// the main subscription resumes after the last one taken.
func (m *Machine) promote(i int, st State, acts []Action) []Action {
	in := m.inputs[i]
	bg := in.bg
	acts = m.stopBackground(i, acts)
	in.replica = bg.replica
	in.tent, in.tentData, in.tentWM, in.failedUp = nil, false, math.MinInt64, false
	// Not a gap of a live subscription: the deliver below is no delivery
	// on the wire.
	in.onAttempt, in.doubtFrom = false, 0
	// The replica read has the best rank, or the one its caller chose
	// it by: deliver does not move the input on (maybeSwitch).
	acts = m.deliver(Deliver{Input: i, Tuples: slices.Clip(bg.kept), Upstream: st}, acts)
	m.promotions++
	if in.replica != bg.replica {
		// deliver moved the input on (a better replica it knows): that
		// subscription too resumes after the ids taken here.
		for k := len(acts) - 1; k >= 0; k-- {
			if a, ok := acts[k].(Subscribe); ok && a.Input == i {
				a.Promoted = true
				acts[k] = a
				break
			}
		}
		return acts
	}
	in.heard, in.onAttempt, in.left = m.now, false, leftAttempt{}
	in.attempt++
	return append(acts, Subscribe{Input: i, Replica: in.replica, AfterID: in.lastStable, Attempt: in.attempt, Promoted: true})
}
