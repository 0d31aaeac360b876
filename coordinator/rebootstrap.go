package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/states"
)

// Re-bootstrap of lossy DCAA replicas (issue 10 P7).
//
// A failure longer than the bound on the input a DCAA task keeps for its
// replay leaves the replica that dropped input "lossy": its correction
// could not make every result exact (UNCORRECTABLE), so its stable stream
// is no longer its peers', and a task downstream of it that took the
// UNCORRECTABLE record is lossy the same way. Left alone it stays so for
// the rest of the query, although a peer replica of its partition may be
// exact. rebootstrapLossy replaces such a copy: a non-live re-placement
// (the lossy copy ends, the next generation is placed) whose new copy
// takes its starting snapshot from a STABLE peer that is not lossy
// (bootstrapSource), so the query has two exact replicas again.
//
// Order matters: a copy of a downstream task bootstrapped while its own
// replica of the upstream is still lossy would read that replica by stable
// ids that mean other results there, silently. So within a query only the
// lossy tasks nearest the sources are replaced, and only while every task
// of the query runs (no replacement or move in flight); the next level
// follows once those run again. A lossy task without a STABLE peer that is
// not lossy (it is the only replica left, or every replica lost input)
// stays lossy: its status says which results could not be corrected and
// `query status` shows it LOSSY; the leader logs it once.

// rebootstrapTick is how often the leader looks for lossy replicas.
const rebootstrapTick = 500 * time.Millisecond

// rebootstrapLossy is a leader duty (see above).
func (s *Server) rebootstrapLossy(ctx context.Context) {
	ticker := time.NewTicker(rebootstrapTick)
	defer ticker.Stop()
	stuckLogged := map[string]bool{} // task id@generation
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		st := s.State()
		at := st.LatestIndex()
		workers, err1 := st.Workers(nil)
		tasks, err2 := st.Tasks(nil)
		queries, err3 := st.Queries(nil)
		if err := errors.Join(err1, err2, err3); err != nil {
			s.logger.Error("lossy replicas: read the state", "err", err)
			continue
		}
		moves, stuck := planRebootstrap(workers, tasks, queries, s.plans.plan, s.hostedLoad())
		for _, t := range stuck {
			key := fmt.Sprintf("%s@%d", t.ID, t.Gen())
			if !stuckLogged[key] {
				stuckLogged[key] = true
				s.logger.Warn("lossy DCAA replica stays lossy: no STABLE peer replica that is not lossy to bootstrap a replacement from",
					"task", t.ID, "generation", t.Gen())
			}
		}
		if len(moves) == 0 {
			continue
		}
		for _, m := range moves {
			s.logger.Info("replacing a lossy DCAA replica by a copy bootstrapped from a STABLE peer",
				"task", m.TaskID, "generation", m.FromGeneration, "from", m.FromWorker, "to", whereText(m.ToWorker))
		}
		s.placeAndLog(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceRebootstrap, StateIndex: at, Placements: moves})
	}
}

// planRebootstrap returns the re-placements of lossy replicas to propose
// now, and the lossy replicas that have no STABLE peer that is not lossy
// (they stay lossy). planOf gives a query's plan (nil: unknown, the query
// is left alone); hosted counts partners' tasks per worker.
//
// Each re-placement moves the lossy copy to a ready worker with room that
// runs no replica of its partition (the new copy is a new generation; its
// assignment names the STABLE peer as its bootstrap source). When no such
// worker exists the task is unplaced instead: the scheduler places it
// again, on its old worker if that is the one with room, still as a new
// generation bootstrapped from the peer.
func planRebootstrap(workers []*fsm.Worker, tasks []*fsm.Task, queries []*fsm.Query,
	planOf func(*fsm.Query) *queryspec.Plan, hosted map[string]int) (moves []fsm.PlannedPlacement, stuck []*fsm.Task) {
	ready, partner := map[string]bool{}, map[string]bool{}
	for _, w := range workers {
		if w.Status == statusReady {
			ready[w.ID] = true
		}
		partner[w.ID] = isPartnerWorker(w)
	}
	byQuery := map[string][]*fsm.Task{}
	for _, t := range tasks {
		byQuery[t.Query] = append(byQuery[t.Query], t)
	}
	var p *placer
	for _, q := range queries {
		qt := byQuery[q.Name]
		if q.Replicas < 2 || q.Status != fsm.QueryStatusRunning || !anyLossy(qt) {
			continue
		}
		plan := planOf(q)
		if plan == nil {
			continue
		}
		// Nothing while a copy of the query starts or moves: a
		// replacement's bootstrap (or a level above) is not done yet.
		busy := false
		for _, t := range qt {
			if t.WorkerID == "" || t.MovingFrom != "" || t.State == states.TaskPending || t.State == states.TaskStarting {
				busy = true
				break
			}
		}
		if busy {
			continue
		}
		depth := depths(plan)
		minDepth := -1
		for _, t := range qt {
			if d := depth[t.Fragment]; t.Lossy && (minDepth < 0 || d < minDepth) {
				minDepth = d
			}
		}
		for _, t := range qt {
			if !t.Lossy || depth[t.Fragment] != minDepth || partner[t.WorkerID] {
				// (A copy at a partner org moves only under its
				// contract: cross-org migration brings it home.)
				continue
			}
			if !hasStablePeer(t, qt, ready) {
				stuck = append(stuck, t)
				continue
			}
			if p == nil {
				p = newPlacer(workers, tasks)
				p.reserve(hosted)
			}
			to, _ := p.pick(t) // "" (none fits): unplace, the scheduler places it
			moves = append(moves, fsm.PlannedPlacement{TaskID: t.ID, FromWorker: t.WorkerID, FromGeneration: t.Gen(), ToWorker: to,
				Message: "lossy DCAA replica replaced: bootstrapping from a STABLE peer"})
		}
	}
	sort.Slice(moves, func(i, j int) bool { return moves[i].TaskID < moves[j].TaskID })
	return moves, stuck
}

func anyLossy(ts []*fsm.Task) bool {
	for _, t := range ts {
		if t.Lossy {
			return true
		}
	}
	return false
}

// hasStablePeer reports whether another replica of t's partition runs on a
// ready worker, STABLE and not lossy: a source bootstrapSource takes.
func hasStablePeer(t *fsm.Task, qt []*fsm.Task, ready map[string]bool) bool {
	for _, p := range qt {
		if p.ID != t.ID && p.Fragment == t.Fragment && p.Partition == t.Partition && !p.Lossy &&
			p.State == states.TaskRunning && p.ReplicaState == replicaStable && p.WorkerID != "" && p.WorkerID != t.WorkerID && ready[p.WorkerID] {
			return true
		}
	}
	return false
}

// depths is each fragment's longest path from a source (sources 0).
func depths(plan *queryspec.Plan) map[string]int {
	out := map[string]int{}
	for _, n := range plan.Nodes { // topological order: inputs first
		d := 0
		for _, in := range n.Inputs {
			d = max(d, out[in]+1)
		}
		out[n.Name] = d
	}
	return out
}

// lossyNote is what query status adds to a lossy replica's message: that
// it is being replaced from a STABLE peer, or that it stays lossy for
// want of one. qt are the tasks of its query; ready the ready workers.
func lossyNote(t *fsm.Task, qt []*fsm.Task, ready map[string]bool) string {
	if hasStablePeer(t, qt, ready) {
		return "lossy: to be replaced by a copy bootstrapped from a STABLE peer replica"
	}
	return "lossy: stays so, no STABLE peer replica that is not lossy to bootstrap a replacement from"
}

// joinNote appends note to a status message.
func joinNote(msg, note string) string {
	if msg == "" {
		return note
	}
	return msg + "; " + note
}

// readyWorkers is the set of ready workers' ids.
func (as *adminService) readyWorkers() map[string]bool {
	ready := map[string]bool{}
	ws, err := as.s.State().Workers(nil)
	if err != nil {
		return ready
	}
	for _, w := range ws {
		if w.Status == statusReady {
			ready[w.ID] = true
		}
	}
	return ready
}
