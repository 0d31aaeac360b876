package coordinator

import (
	"fmt"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// What the owner knows of its copies at partners.
//
// A task at a partner is placed, in the owner's state, on the worker
// record standing for the partner (partnerWorkerID), which stays ready
// while the partner answers syncs. Whether a copy runs there is what the
// partner's sync answers say: a copy it reports lost is placed at home
// again, but a copy of a move still under way is never reported lost
// (the host request may not have arrived yet), and a partner that stops
// answering is dead to the owner only after the partner timeout. Until
// then the task looked connected: a reconfiguration plan waiting for it
// listed nothing disconnected (fedstream query versions) while no copy
// of it ran anywhere. A host now lists every task of the owner's sync of
// which it holds no copy (syncAnswer.Absent); the owner keeps the latest
// answer of each partner here, and
//   - query versions lists a task placed on a partner worker as
//     disconnected when its partner said it has no copy of it, or has not
//     answered a sync for longer than a sync call may take;
//   - a move to a partner whose copy the partner says it has no more is
//     rolled back as soon as that is certain (MigrateTaskOut once the
//     host accepted, reconcileMoveOut after the host call's bound),
//     rather than after the move's whole bound.

// absentCopy is a partner's word that it hosts no copy of a task's
// generation gen: first said in the answer to a sync that began at since
// (this leader's clock), last in one that began at last.
type absentCopy struct {
	org         string
	gen         int
	since, last time.Time
}

// noteCopies records a partner's answer to a sync that began at sent and
// listed tasks: when it answered, and which of the tasks it hosts no copy
// of (only when it says so: an older host lists none).
func (x *xorgMemory) noteCopies(org string, tasks []syncItem, ans syncAnswer, sent time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.answered == nil {
		x.answered, x.absent = map[string]time.Time{}, map[string]absentCopy{}
	}
	x.answered[org] = time.Now()
	if !ans.ListsAbsent {
		return
	}
	gone := map[string]int{}
	for _, it := range ans.Absent {
		gone[it.TaskID] = it.Generation
	}
	for _, it := range tasks {
		g, ok := gone[it.TaskID]
		prev, had := x.absent[it.TaskID]
		switch {
		case !ok || g != it.Generation:
			if had && prev.org == org {
				delete(x.absent, it.TaskID)
			}
		case had && prev.org == org && prev.gen == g:
			prev.last = sent
			x.absent[it.TaskID] = prev
		default:
			x.absent[it.TaskID] = absentCopy{org: org, gen: g, since: sent, last: sent}
		}
	}
	// Tasks no longer synced with org (home again, gone) lose their note.
	listed := map[string]bool{}
	for _, it := range tasks {
		listed[it.TaskID] = true
	}
	for id, a := range x.absent {
		if a.org == org && !listed[id] {
			delete(x.absent, id)
		}
	}
}

// absentSince is when org first said, in the answers to syncs ever since,
// that it has no copy of task's generation gen, and when the latest of
// those syncs began; ok is false unless its latest answer said so.
func (x *xorgMemory) absentSince(org, task string, gen int) (since, last time.Time, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	a, ok := x.absent[task]
	if !ok || a.org != org || a.gen != gen {
		return time.Time{}, time.Time{}, false
	}
	return a.since, a.last, true
}

// lastAnswer is when org last answered a sync of this leader (zero: never).
func (x *xorgMemory) lastAnswer(org string) time.Time {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.answered[org]
}

// partnerCopyMissing says why task t, placed on the worker standing for
// partner org, has no copy this leader knows to run: "" when its partner's
// last answer did not say so and came recently enough. Only the leader
// syncs with partners: elsewhere it says nothing.
func (s *Server) partnerCopyMissing(t *fsm.Task, org string) string {
	if !s.IsLeader() {
		return ""
	}
	if since, _, ok := s.xorg.absentSince(org, t.ID, t.Gen()); ok {
		return fmt.Sprintf("no copy at org %s: it said so %s ago", org, time.Since(since).Round(time.Second))
	}
	last := s.xorg.lastAnswer(org)
	if last.IsZero() {
		return "" // this leader has not synced yet: nothing known either way
	}
	// A sync call is given this long (syncWith), one starts every
	// syncInterval: a partner silent for longer has missed one.
	if quiet := time.Since(last); quiet > max(s.cfg.Timings.PartnerTimeout/3, time.Second)+2*syncInterval {
		return fmt.Sprintf("org %s has not answered a sync for %s", org, quiet.Round(time.Second))
	}
	return ""
}
