package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/states"
)

// Catch-up of a move to a partner, compared fairly.
//
// A catch-up move ends once the new copy's output position has reached
// the old copy's (fsm.Task.MoveCatchUp). Inside an org both copies report
// to the leader within a report interval of each other, so the two
// positions the state machine compares are about equally old. A copy at
// a partner reports to the partner's leader, which passes the report on
// at the owner's next sync: by the time the owner applies it, it is a
// sync interval, a report interval and two leaders' turns older than the
// old copy's position, which its worker reports to the owner's leader
// every 50 ms. A task whose output flows continuously (a union, a map or
// a source at thousands of tuples a second) was therefore always behind
// by that age times its rate when compared, however fast it ran: its move
// ended only at the leader's catch-up bound (Timings.MoveCatchUpBound,
// boundMoveCatchUps) or when its output buffer filled. In session 21's
// soak of fedstream dev at load 25-37 every such move to a partner ran
// to the bound (30 s after the copy ran, 37-51 s in all); with the
// 15 s partner timeout of session 20's soak build the owner's wait
// (the bound plus two partner timeouts) ran out first and the move was
// rolled back: "the new copy did not take over within 1m0s".
//
// So the owner compares a partner's report with where the old copy was
// about when the report was made: each sync notes, when it begins, the
// old copy's position its state holds; the host says how long before its
// answer it received the report (hostedReport.AgeMs, a duration: the two
// orgs' clocks are never compared); the report's position is compared
// with the latest note taken no later than the sync's start less that
// age. Once it has reached it the owner ends the move (SwitchMove, as the
// bound does). Ending a move early is always safe: consumers resume
// after the last tuple they took, from the new copy, which produces
// everything after its snapshot; catch-up only spares them a wait.

// positionAt is an old copy's position at a time of the owner's clock.
type positionAt struct {
	at  time.Time
	pos uint64
}

// positionsKept bounds the notes kept of one move: at a note per sync
// (syncInterval) a minute's worth, far more than a report's age.
const positionsKept = 240

// catchUpKey names a move by its new copy.
func catchUpKey(taskID string, gen int) string { return fmt.Sprintf("%s@%d", taskID, gen) }

// noteOldPositions notes, as a sync with org begins (at now), the old
// copy's position of every catch-up move to org among recs. Moves no
// longer under way lose their notes.
func (s *Server) noteOldPositions(org string, recs []*fsm.HostedTask, now time.Time) {
	pw := partnerWorkerID(org)
	x := &s.xorg
	x.mu.Lock()
	defer x.mu.Unlock()
	prev := x.oldPositions[org]
	cur := map[string][]positionAt{}
	for _, h := range recs {
		t, err := s.State().Task(nil, h.TaskID)
		if err != nil || t == nil || t.WorkerID != pw || t.MovingFrom == "" || !t.MoveCatchUp || t.MovingFromPosition == nil {
			continue
		}
		k := catchUpKey(t.ID, t.Gen())
		notes := append(prev[k], positionAt{at: now, pos: *t.MovingFromPosition})
		if len(notes) > positionsKept {
			notes = notes[len(notes)-positionsKept:]
		}
		cur[k] = notes
	}
	if x.oldPositions == nil {
		x.oldPositions = map[string]map[string][]positionAt{}
	}
	x.oldPositions[org] = cur
}

// oldPositionAt is the old copy's position of move k to org as noted
// last at or before at; ok is false when no note is that old.
func (x *xorgMemory) oldPositionAt(org, k string, at time.Time) (pos uint64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	notes := x.oldPositions[org][k]
	for i := len(notes) - 1; i >= 0; i-- {
		if !notes[i].at.After(at) {
			return notes[i].pos, true
		}
	}
	return 0, false
}

// caughtUpAcross reports whether a partner's report (pos, received by
// its leader age before it answered a sync that began at sent) shows the
// new copy of move k to org at or past where the old copy was then.
func (x *xorgMemory) caughtUpAcross(org, k string, pos uint64, sent time.Time, age time.Duration) bool {
	old, ok := x.oldPositionAt(org, k, sent.Add(-age))
	return ok && pos >= old
}

// endCaughtUpMoves ends the catch-up moves to org whose new copy, by the
// reports of a sync that began at sent, has caught up with the old copy
// as it was when it reported (see above).
func (s *Server) endCaughtUpMoves(ctx context.Context, org string, reports []hostedReport, sent time.Time) {
	pw := partnerWorkerID(org)
	for _, r := range reports {
		if r.MovePosition == nil || r.State != states.TaskRunning {
			continue
		}
		age := time.Duration(r.AgeMs) * time.Millisecond
		if !s.xorg.caughtUpAcross(org, catchUpKey(r.TaskID, r.Generation), *r.MovePosition, sent, age) {
			continue
		}
		t, err := s.State().Task(nil, r.TaskID)
		if err != nil || t == nil || t.WorkerID != pw || t.Gen() != r.Generation || t.MovingFrom == "" || t.State != states.TaskRunning {
			continue // ended meanwhile (the state machine compares too), or not this move
		}
		s.logger.Info("cross-org move: the partner's copy has caught up with where the old copy was when it reported; switching consumers to it",
			"task", t.ID, "org", org, "generation", t.Gen(), "position", *r.MovePosition, "report_age", age, "old_position_now", posText(t.MovingFromPosition))
		upd := fsm.UpdateTaskStatesRequest{WorkerID: pw,
			States: []fsm.TaskStateUpdate{{TaskID: t.ID, Generation: t.Gen(), State: t.State, SwitchMove: true}}}
		if err := s.applyCmd(ctx, fsm.UpdateTaskStatesType, upd); err != nil && ctx.Err() == nil {
			s.logger.Warn("cross-org move: ending a move whose copy caught up; the next sync retries", "task", t.ID, "err", err)
		}
	}
}
