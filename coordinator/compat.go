package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/serf/serf"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
)

// Rolling upgrades beyond the replication protocol (docs/ARCHITECTURE.md,
// "Rolling upgrades"). The leader starts nothing that a worker or partner
// org involved runs on a build too old for it: an older build would not
// refuse it, it would run it differently (a quiescent plan as a live one)
// or never finish it (a hosted task that ignores the owner's
// reconfiguration holds the plan in loading for ever). The refusal names
// who must be upgraded first.

// ErrBuildTooOld means a worker or partner org involved in a request runs a
// build that cannot do what was asked; the error names them and the level
// they need. Nothing was changed.
var ErrBuildTooOld = errors.New("a worker or partner org involved runs a build too old for this")

// tagHostLevel is the federation pool tag in which a coordinator advertises
// its cross-org hosting level (hostLevel*). Coordinators of builds from
// before it advertise nothing (level 0).
const tagHostLevel = "xorg"

// Cross-org hosting levels: what a partner org does with the tasks it
// hosts for an owner.
const (
	// hostLevelReconfig: a hosted task follows the owner's live
	// reconfiguration plans (HostedTask.ReconfigJSON), loads their
	// versions and reports its progress back. Below it a partner ignores
	// them, and its hosted task never acknowledges a plan.
	hostLevelReconfig = 1
	// hostLevel is this build's level.
	hostLevel = hostLevelReconfig
)

// orgHostLevel is the cross-org hosting level of org as the pool's members
// advertise it: the lowest of its live coordinators (any may lead it next),
// 0 for one that advertises none. seen is false when no coordinator of org
// is alive in the pool.
func orgHostLevel(members []fedMember, org string) (level int, seen bool) {
	for _, m := range members {
		if m.Org != org || m.Status != serf.StatusAlive.String() {
			continue
		}
		l, err := strconv.Atoi(m.HostLevel)
		if err != nil || l < 0 {
			l = 0
		}
		if !seen || l < level {
			level = l
		}
		seen = true
	}
	return level, seen
}

// activeReconfig returns the epoch of q's first plan that is not complete
// (0: none).
func activeReconfig(q *fsm.Query) uint64 {
	if q == nil || q.Reconfig == nil {
		return 0
	}
	for _, p := range q.Reconfig.Plans {
		if p.Phase != fsm.ReconfigComplete {
			return p.Epoch
		}
	}
	return 0
}

// checkPartnerHostsReconfig refuses to move a task of q to partner org
// while a reconfiguration plan of q is under way and the partner's
// coordinators do not all advertise hostLevelReconfig: the hosted copy
// would ignore the plan, which would then wait in loading for ever for its
// acknowledgement. Once the plan is complete the move may go (a later
// plan is refused in turn, by checkPlanParticipants).
func checkPartnerHostsReconfig(members []fedMember, q *fsm.Query, partner string) error {
	epoch := activeReconfig(q)
	if epoch == 0 {
		return nil
	}
	if l, seen := orgHostLevel(members, partner); !seen || l < hostLevelReconfig {
		return fmt.Errorf("%w: query %s has reconfiguration plan %d under way and partner org %s %s: a task it hosts would ignore the plan and hold it in loading; move it once the plan is complete, or upgrade %s",
			ErrBuildTooOld, q.Name, epoch, partner, hostLevelText(l, seen), partner)
	}
	return nil
}

func hostLevelText(l int, seen bool) string {
	switch {
	case !seen:
		return "has no live coordinator in the federation pool (build unknown)"
	case l == 0:
		return fmt.Sprintf("advertises no cross-org hosting level (an older build; plans need level %d)", hostLevelReconfig)
	}
	return fmt.Sprintf("advertises cross-org hosting level %d (plans need %d)", l, hostLevelReconfig)
}

// checkPlanParticipants refuses a reconfiguration plan of q with the given
// strategy when a task of q runs where the plan cannot run as committed:
//   - a quiescent plan on a worker below rpc.DataPlaneLevelQuiescent
//     (an older build ignores the strategy and runs the plan live);
//   - any plan on a task hosted at a partner org below hostLevelReconfig
//     (it ignores the plan, which then never completes).
//
// Tasks not placed anywhere hold a plan open until they are placed and
// report, as they always did; they involve no worker yet.
func (s *Server) checkPlanParticipants(q *fsm.Query, strategy string) error {
	st := s.State()
	tasks, err := st.TasksByQuery(nil, q.Name)
	if err != nil {
		return err
	}
	var members []fedMember
	if s.pool != nil {
		members = s.pool.members()
	}
	old := map[string]string{} // worker or partner org -> why it is too old
	for _, t := range tasks {
		if t.WorkerID == "" {
			continue
		}
		w, err := st.Worker(nil, t.WorkerID)
		if err != nil {
			return err
		}
		if w == nil {
			continue
		}
		if isPartnerWorker(w) {
			org := w.Labels[partnerLabel]
			hl, seen := orgHostLevel(members, org)
			wl, known := s.xorg.hostedLevel(t.ID)
			if why := hostedTaskTooOld(org, t.ID, hl, seen, strategy, wl, known); why != "" {
				old[t.WorkerID+"/"+t.ID] = why
			}
			continue
		}
		if strategy == fsm.StrategyQuiescent && rpc.EffectiveDataPlaneLevel(w.DataPlaneLevel) < rpc.DataPlaneLevelQuiescent {
			old[t.WorkerID] = fmt.Sprintf("worker %s states data-plane %s", workerName(w), rpc.DataPlaneLevelText(w.DataPlaneLevel))
		}
	}
	if len(old) == 0 {
		return nil
	}
	why := slices.Sorted(maps.Values(old))
	need := ""
	if strategy == fsm.StrategyQuiescent {
		need = fmt.Sprintf(" (a quiescent plan needs data-plane level %d on every worker of the query: an older one would run it live)", rpc.DataPlaneLevelQuiescent)
	}
	return fmt.Errorf("%w: query %s runs tasks where this plan cannot run%s: %s; upgrade them first, or move the tasks",
		ErrBuildTooOld, q.Name, need, strings.Join(why, "; "))
}

// hostedTaskTooOld says why a plan of the given strategy cannot run on a
// task hosted at partner org ("" if it can): org advertises hosting level
// hostLevel (seen: some coordinator of it is alive in the pool), and its
// last sync said the worker running the task states data-plane level
// workerLevel (known: it said anything). A partner below
// hostLevelReconfig ignores every plan; a quiescent plan also needs the
// partner's worker at rpc.DataPlaneLevelQuiescent.
func hostedTaskTooOld(org, taskID string, hostLevel int, seen bool, strategy string, workerLevel int32, known bool) string {
	if !seen || hostLevel < hostLevelReconfig {
		return fmt.Sprintf("partner org %s (hosting task %s) %s", org, taskID, hostLevelText(hostLevel, seen))
	}
	if strategy != fsm.StrategyQuiescent || rpc.EffectiveDataPlaneLevel(workerLevel) >= rpc.DataPlaneLevelQuiescent {
		return ""
	}
	if !known {
		return fmt.Sprintf("partner org %s has not yet said which data-plane level its worker running task %s has (wait for its next sync)", org, taskID)
	}
	return fmt.Sprintf("partner org %s runs task %s on a worker of data-plane %s", org, taskID, rpc.DataPlaneLevelText(workerLevel))
}

// checkWorkerRunsPlans refuses to move a task of q to worker w while a
// quiescent plan of q is under way and w's build is below
// rpc.DataPlaneLevelQuiescent: the new copy would run the plan live (a
// generator source there would not hold). Once the plan is complete the
// move may go.
func checkWorkerRunsPlans(q *fsm.Query, w *fsm.Worker) error {
	if q == nil || q.Reconfig == nil || rpc.EffectiveDataPlaneLevel(w.DataPlaneLevel) >= rpc.DataPlaneLevelQuiescent {
		return nil
	}
	for _, p := range q.Reconfig.Plans {
		if p.Phase != fsm.ReconfigComplete && p.Strategy == fsm.StrategyQuiescent {
			return fmt.Errorf("%w: query %s has quiescent reconfiguration plan %d under way and worker %s states data-plane %s (a quiescent plan needs level %d: an older worker runs it live); move the task once the plan is complete, or upgrade %s",
				ErrBuildTooOld, q.Name, p.Epoch, w.ID, rpc.DataPlaneLevelText(w.DataPlaneLevel), rpc.DataPlaneLevelQuiescent, w.ID)
		}
	}
	return nil
}

// checkRescaleReaders refuses a rescale of tg in a replicated query while
// a replicated operator that reads the rescaled fragment runs on a worker
// below rpc.DataPlaneLevelRescaleReaders: such a build refuses to hold
// its DCAA machine at the prepare, so the rescale would place its new
// tasks and then be aborted with a less helpful reason. Sinks follow a
// rescale at every level; unplaced tasks involve no worker yet.
func (s *Server) checkRescaleReaders(tg *rescaleTarget) error {
	if tg.replicas < 2 || len(tg.downstream) == 0 {
		return nil
	}
	plan := s.plans.plan(tg.q)
	if plan == nil {
		return nil // rescaleTarget refused an unplannable query already
	}
	st := s.State()
	tasks, err := st.TasksByQuery(nil, tg.q.Name)
	if err != nil {
		return err
	}
	old := map[string]string{}
	for _, t := range tasks {
		n := plan.Node(t.Fragment)
		if !tg.downstream[t.Fragment] || n == nil || n.Kind != queryspec.KindOperator || t.WorkerID == "" {
			continue
		}
		w, err := st.Worker(nil, t.WorkerID)
		if err != nil {
			return err
		}
		if w == nil || rpc.EffectiveDataPlaneLevel(w.DataPlaneLevel) >= rpc.DataPlaneLevelRescaleReaders {
			continue
		}
		old[w.ID] = fmt.Sprintf("worker %s runs %s and states data-plane %s", workerName(w), t.ID, rpc.DataPlaneLevelText(w.DataPlaneLevel))
	}
	if len(old) == 0 {
		return nil
	}
	why := slices.Sorted(maps.Values(old))
	return fmt.Errorf("%w: replicated operators of query %s read %s and a rescale needs data-plane level %d where they run (an older worker cannot take the added partitions' streams into its DCAA machine): %s; upgrade those workers first, or move the tasks",
		ErrBuildTooOld, tg.q.Name, tg.frag, rpc.DataPlaneLevelRescaleReaders, strings.Join(why, "; "))
}

// workerName is w's id followed by its name in brackets when it has one,
// for messages that name workers.
func workerName(w *fsm.Worker) string {
	if w.Name == "" {
		return w.ID
	}
	return w.ID + " (" + w.Name + ")"
}
