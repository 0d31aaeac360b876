package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Cross-org migration (issue 11 item 6): a live task move across a trust
// boundary.
//
// The owner org (A) places the moved task on a worker record that stands
// for the partner org (partnerWorkerID, label partnerLabel), with the
// same live, catch-up move plan as a move inside the org: its old copy
// keeps running and serving every consumer while the new copy starts.
// The partner (B) checks the contract in its own Raft state and records
// the task as hosted (fsm.HostedTask) on one of its workers; that worker
// fetches the starting snapshot of A's running copy, with its input
// positions, and subscribes to its upstreams in A, all through the
// cross-org data plane (xorg_dataplane.go). A's leader polls B (a sync
// every syncInterval) for the new copy's reports and applies them as
// reports of the partner worker, so A's state machine ends the move as
// in-org: once the new copy runs and its output position has reached the
// old copy's, consumers switch to it (through the relay) and the old
// copy stops. Nothing is lost or processed twice for the same reasons as
// in-org (docs/ARCHITECTURE.md, "Moving a task while it runs").
//
// Exactly one copy runs whatever fails:
//   - A move that does not end in time (partner refused, partitioned,
//     dead) is rolled back with AbortMove: the task is back on its old
//     copy, which never stopped and which consumers never left; A drops
//     its hosted record, so B's copy can read nothing more from A (the
//     data port refuses it), and B drops its record at the next sync, or
//     by itself once A has been silent for PartnerTimeout.
//   - A partner unreachable past PartnerTimeout, or failed in the
//     federation pool, is dead to A: its partner worker goes down, and
//     the re-placement loop places its tasks at home again, each from a
//     running peer replica's snapshot if the query has replicas, or else
//     replaying from its upstreams' buffers (the partner's state is gone
//     with it). B does the same on its side and drops A's tasks.
//
// A sync is also how B learns that a task went home or that a move was
// aborted: a hosted task A no longer lists is dropped.

// Migration message kinds (federation.Message), between org leaders.
const (
	// msgHost asks the partner to host a task (hostRequest); the answer
	// is MsgOK or MsgRefused with the reason.
	msgHost = "xorg-host"
	// msgSync lists the owner's tasks at the partner (syncRequest); the
	// answer carries their copies' latest reports (syncAnswer).
	msgSync = "xorg-sync"
)

const syncInterval = 250 * time.Millisecond

var (
	// ErrNotAtPartner: the task does not run at a partner org.
	ErrNotAtPartner = errors.New("task does not run at a partner org")
	// ErrMigrationRolledBack: a cross-org move did not complete and was
	// undone; the task runs at home, on its old copy.
	ErrMigrationRolledBack = errors.New("cross-org move rolled back")
	// ErrAtPartnerAlready: the task to move runs at a partner org.
	ErrAtPartnerAlready = errors.New("the task runs at a partner org already")
)

type hostRequest struct {
	Task  fsm.HostedTask `json:"task"`
	Class string         `json:"class"`
}

type syncItem struct {
	TaskID     string `json:"task_id"`
	Generation int    `json:"generation"`
	Phase      string `json:"phase"`
	// Reconfig and MarkersExpected: the owner's reconfiguration state of
	// the task's query and the task's marker count (fsm.HostedTask).
	Reconfig        json.RawMessage `json:"reconfig,omitempty"`
	MarkersExpected int             `json:"markers_expected,omitempty"`
}

type syncRequest struct {
	Tasks []syncItem `json:"tasks"`
	// StateIndex is the owner's applied Raft index no later than it read
	// the tasks it lists (since session 21; 0 from an older owner). A
	// host drops a copy the list leaves out only if the owner had
	// recorded that copy's move by then (fsm.HostedTask.OwnerIndex): the
	// owner's sync loop reads its list, then syncs each partner in turn,
	// so a list read before a move's record was written reached the host
	// after it had accepted the move, and the host dropped the new copy
	// 0.7-1.5 s after accepting it (session 21's soak, twice in 6
	// minutes); the move then waited out its whole bound and rolled back.
	StateIndex uint64 `json:"state_index,omitempty"`
}

// hostedReport is the latest report of a hosted copy.
type hostedReport struct {
	TaskID       string  `json:"task_id"`
	Generation   int     `json:"generation"`
	State        string  `json:"state"`
	Message      string  `json:"message,omitempty"`
	MovePosition *uint64 `json:"move_position,omitempty"`
	MoveBlocked  bool    `json:"move_blocked,omitempty"`
	// Reconfig is the copy's live reconfiguration progress (nil: none
	// reported), which the owner's plans wait for like any task's.
	Reconfig *hostedReconfig `json:"reconfig,omitempty"`
	// DataPlaneLevel is the data-plane level of the host's worker running
	// the copy (rolling upgrades; 0: not stated, an older host or worker).
	DataPlaneLevel int32 `json:"dataplane_level,omitempty"`
	// AgeMs is how long before the host answered the sync its leader had
	// received this report (since session 21): the owner compares the
	// copy's MovePosition with where the old copy was about then
	// (xorg_catchup.go), not with where it is now. A duration, never a
	// time: the two orgs' clocks are not compared. 0 from an older host.
	AgeMs int64 `json:"age_ms,omitempty"`
}

// hostedReconfig is a hosted copy's reconfiguration progress (see
// fsm.TaskStateUpdate).
type hostedReconfig struct {
	Acked    uint64                `json:"acked"`
	Level    uint64                `json:"level"`
	Frontier int64                 `json:"frontier,omitempty"`
	Markers  []fsm.ReconfigMarkers `json:"markers,omitempty"`
	// Switches are a hosted source copy's switch points (since session
	// 20): the owner keeps them for the task's next copies (fsm
	// ReconfigKept) as it does its own workers' (a copy that comes home,
	// or is placed again at home, tags what it replays by them). A host
	// of an older build sends none (the owner then keeps only the
	// frontier), and one of an older owner ignores the field.
	Switches []fsm.ReconfigSwitch `json:"switches,omitempty"`
}

// hostedReconfigOf is the progress a hosted copy's worker reported, as
// its host passes it to the owner (nil: none reported).
func hostedReconfigOf(rp *pb.ReconfigProgress) *hostedReconfig {
	if rp == nil {
		return nil
	}
	r := &hostedReconfig{Acked: rp.Acked, Level: rp.Level, Frontier: rp.Frontier}
	for _, m := range rp.Markers {
		r.Markers = append(r.Markers, fsm.ReconfigMarkers{Epoch: m.Epoch, Seen: int(m.Seen), Expected: int(m.Expected)})
	}
	for _, sw := range rp.Switches {
		if sw != nil && sw.Epoch != 0 {
			r.Switches = append(r.Switches, fsm.ReconfigSwitch{Epoch: sw.Epoch, At: sw.At})
		}
	}
	return r
}

// fill puts the progress a host reported into the owner's update of the
// task, as a report of one of its own workers would (see
// WorkerService.ReportTaskStates).
func (rp *hostedReconfig) fill(u *fsm.TaskStateUpdate) {
	if rp == nil {
		return
	}
	u.Reconfig, u.ReconfigAcked, u.ReconfigLevel, u.ReconfigFrontier, u.ReconfigMarkers = true, rp.Acked, rp.Level, rp.Frontier, rp.Markers
	u.ReconfigSwitches = rp.Switches
}

type syncAnswer struct {
	Reports []hostedReport `json:"reports"`
	// Lost lists tasks the owner listed that no longer run here: their
	// worker went down (the record is dropped), or the host dropped them
	// earlier (its owner was silent past the partner timeout). The owner
	// brings them home. A task still moving is never reported lost: the
	// host request may not have arrived yet (the move rolls back by
	// itself if it never does).
	Lost []syncItem `json:"lost,omitempty"`
	// Absent lists every task the owner listed of which no copy of the
	// listed generation is hosted here any more, a task still moving
	// included (since session 21; ListsAbsent says the host lists them:
	// an older host does not, and its silence means nothing). The owner
	// shows such a task as disconnected and rolls back a move whose copy
	// is gone (xorg_copies.go).
	Absent      []syncItem `json:"absent,omitempty"`
	ListsAbsent bool       `json:"lists_absent,omitempty"`
}

// xorgMemory is the leader's volatile state of cross-org migration: lost
// with leadership, refilled within a sync.
type xorgMemory struct {
	mu sync.Mutex
	// reports: the host's workers' latest reports of hosted copies, by
	// fsm.HostedTaskID, and when this leader received each.
	reports    map[string]hostedReport
	reportedAt map[string]time.Time
	// synced: when each owner org last synced with this host.
	synced map[string]time.Time
	// hostedLevels: on the owner, the data-plane level of the partner's
	// worker running each of its tasks hosted there, by task id, as the
	// partner's last sync said (0: it did not say).
	hostedLevels map[string]int32
	// answered: on the owner, when each partner last answered a sync
	// (this leader's clock); absent: the tasks whose copy a partner's
	// answer said it does not host (syncAnswer.Absent), by task id
	// (xorg_copies.go).
	answered map[string]time.Time
	absent   map[string]absentCopy
	// oldPositions: on the owner, the old copies' positions of catch-up
	// moves to each partner, as this leader's state held them when each
	// sync began (by partner, then task id@generation; see
	// noteOldPositions).
	oldPositions map[string]map[string][]positionAt
}

func (x *xorgMemory) setHostedLevel(taskID string, l int32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.hostedLevels == nil {
		x.hostedLevels = map[string]int32{}
	}
	x.hostedLevels[taskID] = l
}

// hostedLevel is the level setHostedLevel recorded for taskID; ok is false
// when no sync has said anything of it yet.
func (x *xorgMemory) hostedLevel(taskID string) (l int32, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	l, ok = x.hostedLevels[taskID]
	return l, ok
}

func (x *xorgMemory) report(id string, r hostedReport) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.reports == nil {
		x.reports, x.reportedAt = map[string]hostedReport{}, map[string]time.Time{}
	}
	x.reports[id], x.reportedAt[id] = r, time.Now()
}

// lastReport is the latest report of hosted copy id, its AgeMs set.
func (x *xorgMemory) lastReport(id string) (hostedReport, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r, ok := x.reports[id]
	if ok {
		r.AgeMs = max(0, time.Since(x.reportedAt[id]).Milliseconds())
	}
	return r, ok
}

func (x *xorgMemory) touch(owner string, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.synced == nil {
		x.synced = map[string]time.Time{}
	}
	x.synced[owner] = at
}

// since returns when owner last synced, starting its clock at now if it
// never did (a new leader gives every owner a full timeout).
func (x *xorgMemory) since(owner string, now time.Time) time.Time {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.synced == nil {
		x.synced = map[string]time.Time{}
	}
	if _, ok := x.synced[owner]; !ok {
		x.synced[owner] = now
	}
	return x.synced[owner]
}

// partnerWorkerID is the id of the worker record standing for org.
func partnerWorkerID(org string) string { return "org:" + org }

// TasksAtPartners lists this org's tasks running at partners (or moving
// there, or coming back): task id -> partner org.
func (s *Server) TasksAtPartners() map[string]string {
	out := map[string]string{}
	hs, err := s.State().HostedTasks(nil)
	if err != nil {
		s.logger.Error("tasks at partners: read hosted tasks", "err", err)
		return out
	}
	for _, h := range hs {
		if h.Owner == s.cfg.Org {
			out[h.TaskID] = h.Host
		}
	}
	return out
}

// applyCmd applies a command and returns its error, the command's own
// included.
func (s *Server) applyCmd(ctx context.Context, t fsm.MessageType, body any) error {
	res, err := s.apply(ctx, t, body)
	if err != nil {
		return err
	}
	return res.Err
}

// taskClass is the class a contract's task list names: the kind of the
// task's fragment ("source", "operator" or "sink") or, for an operator,
// its type (e.g. "aggregate"); a contract listing either allows it.
func (s *Server) taskClasses(q *fsm.Query, fragment string) []string {
	plan := s.plans.plan(q)
	if plan == nil {
		return nil
	}
	n := plan.Node(fragment)
	if n == nil {
		return nil
	}
	out := []string{string(n.Kind)}
	if n.Op != nil {
		out = append(out, string(n.Op.Type))
	}
	return out
}

// taskLoad is the task's latest reported CPU seconds per second (0 when
// none was reported yet).
func (s *Server) taskLoad(taskID string) float64 {
	var load float64
	for _, ts := range s.liveStats.of(map[string]bool{taskID: true}, time.Now().Add(-time.Minute))[taskID] {
		load = max(load, ts.CpuSecondsPerS)
	}
	return load
}

// contractFor checks that contract id lets this org's task of the given
// classes and load run at partner now, within what already runs there
// under it (except the task itself).
func (s *Server) contractFor(id, owner, host string, classes []string, load float64, taskID string) (federation.ContractDoc, error) {
	doc, err := s.fed.Contract(id)
	if err != nil {
		return doc, err
	}
	terms := doc.Terms.MPA()
	switch {
	case doc.Status != federation.StatusActive:
		return doc, fmt.Errorf("contract %s is %s, not active", id, doc.Status)
	case !terms.InForce(time.Now()):
		return doc, fmt.Errorf("contract %s is not in force (valid %s to %s)", id, doc.Terms.NotBefore.Format(time.RFC3339), doc.Terms.NotAfter.Format(time.RFC3339))
	case !terms.Allows(owner, host):
		return doc, fmt.Errorf("contract %s (direction %s, proposed by %s) does not let %s's tasks run at %s", id, doc.Terms.Direction, doc.Terms.Proposer, owner, host)
	}
	allowed := len(terms.Classes) == 0
	for _, c := range classes {
		allowed = allowed || terms.AllowsClass(c)
	}
	if !allowed {
		return doc, fmt.Errorf("contract %s allows task classes %v; task %s is %v", id, terms.Classes, taskID, classes)
	}
	hs, err := s.State().HostedTasks(nil)
	if err != nil {
		return doc, err
	}
	used := load
	for _, h := range hs {
		if h.Contract == id && h.Owner == owner && h.TaskID != taskID {
			used += h.Load
		}
	}
	if used > doc.Terms.MaxLoad {
		return doc, fmt.Errorf("contract %s: load %.3g with this task exceeds its max load %.3g", id, used, doc.Terms.MaxLoad)
	}
	return doc, nil
}

// ensurePartnerWorker registers (or refreshes) the worker record standing
// for org: ready, at this leader's org port (where this org's workers
// read a partner's streams through the relay), excluded from ordinary
// placement (scheduler.go).
func (s *Server) ensurePartnerWorker(ctx context.Context, org string) error {
	id := partnerWorkerID(org)
	w, err := s.State().Worker(nil, id)
	if err != nil {
		return err
	}
	s.liveness.touch(id, time.Now().Add(2*s.cfg.Timings.PartnerTimeout))
	if w != nil && w.Status == statusReady && w.Addr == s.GRPCAddr() && w.Labels[partnerLabel] == org {
		return nil
	}
	return s.applyCmd(ctx, fsm.RegisterWorkerType, fsm.RegisterWorkerRequest{At: time.Now().UnixNano(), Worker: fsm.Worker{
		ID: id, Name: "partner org " + org, Org: s.cfg.Org, Addr: s.GRPCAddr(), Cores: 1 << 16, Status: statusReady,
		Labels: map[string]string{partnerLabel: org},
	}})
}

// MigrateTaskOut moves a running task to partnerOrg under contractID;
// returns once the partner runs it and every consumer reads the
// partner's copy, or an error after rolling back (the task then runs at
// home).
func (s *Server) MigrateTaskOut(ctx context.Context, taskID, partnerOrg, contractID string) error {
	if s.pool == nil {
		return errNoCrossOrgTransport
	}
	if !s.IsLeader() {
		return ErrNoPlanApplier
	}
	st := s.State()
	t, err := st.Task(nil, taskID)
	if err != nil {
		return err
	}
	switch {
	case t == nil:
		return fmt.Errorf("move %s to %s: no such task", taskID, partnerOrg)
	case t.WorkerID == "":
		return fmt.Errorf("move %s to %s: the task is not placed (%s)", taskID, partnerOrg, t.Message)
	case t.MovingFrom != "":
		return fmt.Errorf("move %s to %s: the task is still moving from %s", taskID, partnerOrg, t.MovingFrom)
	}
	if w, err := st.Worker(nil, t.WorkerID); err != nil {
		return err
	} else if w != nil && isPartnerWorker(w) {
		return fmt.Errorf("move %s to %s: %w: %s", taskID, partnerOrg, ErrAtPartnerAlready, w.Labels[partnerLabel])
	}
	q, err := st.Query(nil, t.Query)
	if err != nil || q == nil {
		return fmt.Errorf("move %s: query %s: %v", taskID, t.Query, err)
	}
	classes := s.taskClasses(q, t.Fragment)
	load := s.taskLoad(taskID)
	if _, err := s.contractFor(contractID, s.cfg.Org, partnerOrg, classes, load, taskID); err != nil {
		return fmt.Errorf("move %s to %s: %w", taskID, partnerOrg, err)
	}
	if isIngestSource(&s.plans, q, t.Fragment) {
		return fmt.Errorf("move %s to %s: an ingest source's clients push to the org's own workers; it cannot run at a partner", taskID, partnerOrg)
	}
	if err := checkPartnerHostsReconfig(s.pool.members(), q, partnerOrg); err != nil {
		return fmt.Errorf("move %s to %s: %w", taskID, partnerOrg, err)
	}
	if err := s.ensurePartnerWorker(ctx, partnerOrg); err != nil {
		return fmt.Errorf("move %s to %s: partner worker: %w", taskID, partnerOrg, err)
	}
	if err := s.checkProtocol(7, "a cross-org move"); err != nil {
		return err
	}
	if err := s.checkNeighbourMoves(st, t); err != nil {
		return fmt.Errorf("move %s to %s: %w", taskID, partnerOrg, err)
	}
	if h := s.cfg.hooks.moveChecked; h != nil {
		h(t.ID)
	}
	pw, gen := partnerWorkerID(partnerOrg), t.Gen()
	out, err := s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, StateIndex: st.LatestIndex(),
		Placements: []fsm.PlannedPlacement{{TaskID: t.ID, FromWorker: t.WorkerID, FromGeneration: gen, ToWorker: pw, Live: true, CatchUp: true}}})
	if err != nil {
		return fmt.Errorf("move %s to %s: %w", taskID, partnerOrg, err)
	}
	if len(out.Result.Refused) > 0 {
		return fmt.Errorf("move %s to %s refused: %s", taskID, partnerOrg, out.Result.RefusedText())
	}
	// The wait for the move's end, once the partner hosts the new copy.
	bound := s.cfg.Timings.MoveCatchUpBound + 2*s.cfg.Timings.PartnerTimeout
	rec := fsm.HostedTask{ID: fsm.HostedTaskID(s.cfg.Org, t.ID), Owner: s.cfg.Org, Host: partnerOrg, Contract: contractID,
		Query: t.Query, TaskID: t.ID, Fragment: t.Fragment, Partition: t.Partition, Replica: t.Replica,
		Generation: gen + 1, SourceGeneration: gen, Phase: fsm.HostedMoving, Since: time.Now().UnixNano(), Load: load}
	rollback := func(why error) error {
		return s.rollbackMigration(t.ID, partnerOrg, gen+1, why)
	}
	if err := s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: rec}); err != nil {
		return rollback(err)
	}
	// At or after the record's index: a sync listing from an older state
	// leaves the copy alone at the host.
	rec.OwnerIndex = s.State().LatestIndex()
	// The host needs the query to run one of its tasks.
	rec.SpecJSON = q.SpecJSON
	rec.ReconfigJSON, rec.MarkersExpected = s.hostedReconfig(q, t.Fragment)
	// The partner's worker may take as long to fetch the starting
	// snapshot as this org waits for the move: relayed across the orgs
	// on a busy machine a fetch took 16 s for 1 MB (session 21's soak),
	// and the worker's own minute gave up on one in session 20's.
	rec.BootstrapTimeoutMs = bound.Milliseconds()
	qtasks, err := st.TasksByQuery(nil, t.Query)
	if err != nil {
		return rollback(err)
	}
	for _, p := range qtasks {
		rec.Peers = append(rec.Peers, fsm.HostedPeer{TaskID: p.ID, Fragment: p.Fragment, Partition: p.Partition, Replica: p.Replica})
	}
	maps, err := st.SlotMaps(nil, t.Query)
	if err != nil {
		return rollback(err)
	}
	for _, m := range maps {
		if m.QueryIndex == q.CreateIndex {
			rec.SlotMaps = append(rec.SlotMaps, *m)
		}
	}
	class := ""
	if len(classes) > 0 {
		class = classes[len(classes)-1]
	}
	body, err := json.Marshal(hostRequest{Task: rec, Class: class})
	if err != nil {
		return rollback(err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timings.PartnerTimeout)
	ans, err := s.pool.Call(cctx, partnerOrg, federation.Message{Kind: msgHost, From: s.cfg.Org, Body: body})
	cancel()
	if err == nil && ans.Kind == federation.MsgRefused {
		err = fmt.Errorf("%w: %s", federation.ErrRefused, ans.Reason)
	}
	if err != nil {
		return rollback(fmt.Errorf("%s would not host it: %w", partnerOrg, err))
	}
	hosted := time.Now()
	s.logger.Info("cross-org move: the partner hosts the new copy; waiting for it to catch up", "task", t.ID, "to_org", partnerOrg, "generation", gen+1)
	// The move ends in the state machine (the partner's reports arrive
	// with the syncs); wait for it, bounded.
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cur, err := s.State().Task(nil, t.ID)
		if err != nil {
			return rollback(err)
		}
		switch {
		case cur == nil:
			return fmt.Errorf("move %s to %s: the task was removed (query stopped)", taskID, partnerOrg)
		case cur.WorkerID == pw && cur.Gen() == gen+1 && cur.MovingFrom == "":
			rec.Phase = fsm.HostedRunning
			rec.SpecJSON, rec.Peers, rec.SlotMaps, rec.ReconfigJSON, rec.MarkersExpected = nil, nil, nil, nil, 0
			if err := s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: rec, IfGeneration: gen + 1}); err != nil {
				s.logger.Warn("cross-org move: recording the move's end", "task", t.ID, "err", err)
			}
			s.logger.Info("cross-org move done: consumers read the partner's copy", "task", t.ID, "org", partnerOrg, "generation", gen+1)
			return nil
		case cur.WorkerID != pw || cur.Gen() != gen+1:
			// Rolled back or re-placed by someone else (the partner died).
			return fmt.Errorf("%w: move %s to %s: the task is now on %s generation %d", ErrMigrationRolledBack, taskID, partnerOrg, cur.WorkerID, cur.Gen())
		}
		// The partner accepted the copy, then said in a later sync that
		// it has it no more (dropped: its worker went down, or this org
		// was silent past its partner timeout): nothing will run there.
		if _, last, gone := s.xorg.absentSince(partnerOrg, t.ID, gen+1); gone && last.After(hosted) {
			return rollback(fmt.Errorf("org %s no longer has the new copy", partnerOrg))
		}
		select {
		case <-wctx.Done():
			return rollback(fmt.Errorf("the new copy did not take over within %s: %w", bound, wctx.Err()))
		case <-tick.C:
		}
	}
}

// rollbackMigration undoes a move of task to partner whose new copy is
// generation gen: back on the old copy, unless the move ended meanwhile
// (then the move succeeded and nil is returned).
func (s *Server) rollbackMigration(taskID, partner string, gen int, why error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.applyCmd(ctx, fsm.AbortMoveType, fsm.AbortMoveRequest{TaskID: taskID, Generation: gen, Reason: why.Error()})
	if errors.Is(err, fsm.ErrNotMoving) {
		if t, _ := s.State().Task(nil, taskID); t != nil && t.WorkerID == partnerWorkerID(partner) && t.Gen() == gen && t.MovingFrom == "" {
			return nil // it completed after all
		}
	} else if err != nil {
		return fmt.Errorf("move %s to %s failed (%v) and rolling it back failed too: %w", taskID, partner, why, err)
	}
	if err := s.applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: fsm.HostedTaskID(s.cfg.Org, taskID), IfGeneration: gen}); err != nil && !errors.Is(err, fsm.ErrHostedStale) {
		s.logger.Warn("cross-org move rolled back; dropping its record failed (the sync drops it)", "task", taskID, "err", err)
	}
	s.logger.Warn("cross-org move rolled back: the task runs at home on its old copy", "task", taskID, "org", partner, "reason", why)
	return fmt.Errorf("%w: move %s to %s: %v", ErrMigrationRolledBack, taskID, partner, why)
}

// ReturnTaskHome moves a task hosted by a partner back to this org.
func (s *Server) ReturnTaskHome(ctx context.Context, taskID string) error {
	if !s.IsLeader() {
		return ErrNoPlanApplier
	}
	st := s.State()
	rec, err := st.HostedTask(nil, s.cfg.Org, taskID)
	if err != nil {
		return err
	}
	t, err := st.Task(nil, taskID)
	if err != nil {
		return err
	}
	if rec == nil || t == nil || t.WorkerID != partnerWorkerID(rec.Host) {
		return fmt.Errorf("%w: %s", ErrNotAtPartner, taskID)
	}
	if t.MovingFrom != "" {
		return fmt.Errorf("return %s: the task is still moving from %s", taskID, t.MovingFrom)
	}
	workers, err := st.Workers(nil)
	if err != nil {
		return err
	}
	tasks, err := st.Tasks(nil)
	if err != nil {
		return err
	}
	to, why := newPlacer(workers, tasks).pick(t)
	if to == "" {
		return fmt.Errorf("return %s: no worker at home can take it: %s", taskID, why)
	}
	if err := s.checkNeighbourMoves(st, t); err != nil {
		return fmt.Errorf("return %s: %w", taskID, err)
	}
	gen := t.Gen()
	ret := *rec
	ret.Phase = fsm.HostedReturning
	if err := s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: ret, IfGeneration: gen}); err != nil {
		return fmt.Errorf("return %s: %w", taskID, err)
	}
	out, err := s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, StateIndex: st.LatestIndex(),
		Placements: []fsm.PlannedPlacement{{TaskID: t.ID, FromWorker: t.WorkerID, FromGeneration: gen, ToWorker: to, Live: true, CatchUp: true}}})
	if err == nil && len(out.Result.Refused) > 0 {
		err = errors.New(out.Result.RefusedText())
	}
	if err != nil {
		_ = s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: *rec, IfGeneration: gen})
		return fmt.Errorf("return %s: %w", taskID, err)
	}
	s.logger.Info("returning a task from a partner: the home copy starts from the partner's", "task", taskID, "from_org", rec.Host, "to", to, "generation", gen+1)
	bound := s.cfg.Timings.MoveCatchUpBound + 2*s.cfg.Timings.PartnerTimeout
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cur, err := s.State().Task(nil, taskID)
		if err != nil {
			return err
		}
		switch {
		case cur == nil:
			return fmt.Errorf("return %s: the task was removed (query stopped)", taskID)
		case cur.WorkerID == to && cur.Gen() == gen+1 && cur.MovingFrom == "":
			// The sync no longer lists it: the partner drops its copy.
			if err := s.applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: rec.ID, IfGeneration: gen}); err != nil {
				s.logger.Warn("task returned; dropping its record failed (the sync drops it)", "task", taskID, "err", err)
			}
			s.logger.Info("task returned home", "task", taskID, "from_org", rec.Host, "worker", to)
			return nil
		case cur.WorkerID != to || cur.Gen() != gen+1:
			return fmt.Errorf("return %s: the task is now on %s generation %d", taskID, cur.WorkerID, cur.Gen())
		}
		select {
		case <-wctx.Done():
			err := s.applyCmd(context.Background(), fsm.AbortMoveType, fsm.AbortMoveRequest{TaskID: taskID, Generation: gen + 1, Reason: "the home copy did not take over in time"})
			if err == nil {
				_ = s.applyCmd(context.Background(), fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: *rec, IfGeneration: gen})
			}
			return fmt.Errorf("return %s: the home copy did not take over within %s; the task stays at %s: %w", taskID, bound, rec.Host, wctx.Err())
		case <-tick.C:
		}
	}
}

// syncPartners is a leader duty of the owner side: every syncInterval it
// lists to each partner the tasks it runs there, applies the copies'
// reports as the partner worker's, drops the records of tasks that came
// home, and declares dead a partner unreachable past PartnerTimeout or
// failed in the pool.
func (s *Server) syncPartners(ctx context.Context) {
	if s.pool == nil {
		return
	}
	lastOK := map[string]time.Time{}
	tick := time.NewTicker(syncInterval)
	defer tick.Stop()
	// Returns of tasks whose contract ended, one at a time per task; this
	// loop owns their goroutines.
	var returns sync.WaitGroup
	defer returns.Wait()
	var returningMu sync.Mutex
	returning := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Read before the tasks: the list reflects at least this index.
		listedAt := s.State().LatestIndex()
		hs, err := s.State().HostedTasks(nil)
		if err != nil {
			continue
		}
		byHost := map[string][]*fsm.HostedTask{}
		for _, h := range hs {
			if h.Owner != s.cfg.Org {
				continue
			}
			t, err := s.State().Task(nil, h.TaskID)
			if err != nil {
				continue
			}
			pw := partnerWorkerID(h.Host)
			if t == nil || (t.WorkerID != pw && t.MovingFrom != pw) {
				// Home again (returned, rolled back, re-placed) or gone.
				if err := s.applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: h.ID, IfGeneration: h.Generation}); err != nil && ctx.Err() == nil {
					s.logger.Warn("dropping the record of a task back home", "task", h.TaskID, "err", err)
				}
				continue
			}
			if h.Phase == fsm.HostedMoving && t.WorkerID == pw && t.Gen() == h.Generation {
				var ok bool
				if h, ok = s.reconcileMoveOut(ctx, t, h); !ok {
					continue
				}
			}
			byHost[h.Host] = append(byHost[h.Host], h)
			if t.WorkerID == pw && t.MovingFrom == "" && h.Phase == fsm.HostedRunning && !s.contractInForce(h.Contract) {
				returningMu.Lock()
				busy := returning[h.TaskID]
				returning[h.TaskID] = true
				returningMu.Unlock()
				if !busy {
					s.logger.Info("the contract a task runs at a partner under has ended: bringing it home", "task", h.TaskID, "org", h.Host, "contract", h.Contract)
					returns.Add(1)
					go func(id string) {
						defer returns.Done()
						if err := s.ReturnTaskHome(ctx, id); err != nil && ctx.Err() == nil {
							s.logger.Warn("returning a task whose contract ended; will retry", "task", id, "err", err)
						}
						returningMu.Lock()
						delete(returning, id)
						returningMu.Unlock()
					}(h.TaskID)
				}
			}
		}
		for org := range lastOK {
			if len(byHost[org]) == 0 {
				delete(lastOK, org)
			}
		}
		for org, recs := range byHost {
			if _, ok := lastOK[org]; !ok {
				lastOK[org] = time.Now()
			}
			err := s.syncWith(ctx, org, recs, listedAt)
			if err == nil {
				lastOK[org] = time.Now()
				continue
			}
			gone := !s.pool.Known(org)
			if gone || time.Since(lastOK[org]) > s.cfg.Timings.PartnerTimeout {
				s.partnerDead(ctx, org, recs, err, gone)
				delete(lastOK, org)
			}
		}
	}
}

// reconcileMoveOut settles the record of a move out to a partner (phase
// moving, task t placed on the partner at the record's generation) that
// no MigrateTaskOut may be waiting for any more, as one whose leader
// changed (or whose last write failed) leaves it:
//   - The move ended in the state machine (the new copy took over) but
//     its end was not recorded: the record goes to running. A host that
//     dropped the copy meanwhile (its owner silent past the partner
//     timeout) reports a running task lost at the next sync, and
//     lostAtPartner places it at home; a moving one it never reports (its
//     host request may not have arrived yet), so left moving the task
//     would stay at the partner, running nowhere, for ever (and every
//     reconfiguration plan of its query would wait for it).
//   - The move has not ended within the bound of its waiter
//     (MigrateTaskOut: the host call, then the catch-up bound and two
//     partner timeouts) and one partner timeout more: no waiter is left to
//     roll it back, so this does, as the waiter would have (the task runs
//     at home on its old copy, which never stopped).
//
// It returns the record to sync, and false when the task is not at the
// partner any more.
func (s *Server) reconcileMoveOut(ctx context.Context, t *fsm.Task, h *fsm.HostedTask) (*fsm.HostedTask, bool) {
	if t.MovingFrom == "" {
		rec := *h
		rec.Phase = fsm.HostedRunning
		rec.SpecJSON, rec.Peers, rec.SlotMaps, rec.ReconfigJSON, rec.MarkersExpected = nil, nil, nil, nil, 0
		if err := s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: rec, IfGeneration: h.Generation}); err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("cross-org move: recording the end of a move that ended; the next sync retries", "task", t.ID, "org", h.Host, "err", err)
			}
			return h, true
		}
		// Usually MigrateTaskOut writes the same a moment later (an
		// idempotent write): only its absence is worth saying.
		s.logger.Debug("cross-org move: its end recorded by the sync", "task", t.ID, "org", h.Host, "generation", h.Generation)
		return &rec, true
	}
	bound := s.cfg.Timings.MoveCatchUpBound + 4*s.cfg.Timings.PartnerTimeout
	why := fmt.Errorf("the new copy did not take over within %s of the move's start, and no move waits for it any more", bound)
	if h.Since == 0 || time.Since(time.Unix(0, h.Since)) <= bound {
		// The host says it has no copy, in answers to syncs begun after
		// any host request of the move has ended (MigrateTaskOut gives
		// the call a partner timeout, after writing the record): no
		// copy will run there. The old copy never stopped.
		hostCallEnded := time.Unix(0, h.Since).Add(2 * s.cfg.Timings.PartnerTimeout)
		since, last, absent := s.xorg.absentSince(h.Host, t.ID, h.Generation)
		if h.Since == 0 || !absent || last.Before(hostCallEnded) {
			return h, true
		}
		why = fmt.Errorf("org %s has no copy of the new generation (it said so in every sync since %s)", h.Host, since.Format(time.RFC3339))
	}
	err := s.rollbackMigration(t.ID, h.Host, h.Generation, why)
	if errors.Is(err, ErrMigrationRolledBack) {
		return h, false
	}
	if err == nil {
		return h, true // it ended after all; the next round records it
	}
	if ctx.Err() == nil {
		s.logger.Warn("cross-org move: rolling back a move left without its waiter; the next sync retries", "task", t.ID, "org", h.Host, "err", err)
	}
	return h, true
}

// contractInForce reports whether contract id is active and in force.
func (s *Server) contractInForce(id string) bool {
	doc, err := s.fed.Contract(id)
	return err == nil && doc.Status == federation.StatusActive && doc.Terms.MPA().InForce(time.Now())
}

// syncWith runs one sync with partner org.
func (s *Server) syncWith(ctx context.Context, org string, recs []*fsm.HostedTask, listedAt uint64) error {
	sent := time.Now()
	s.noteOldPositions(org, recs, sent)
	req := syncRequest{StateIndex: listedAt}
	for _, h := range recs {
		it := syncItem{TaskID: h.TaskID, Generation: h.Generation, Phase: h.Phase}
		if q, err := s.State().Query(nil, h.Query); err == nil && q != nil {
			it.Reconfig, it.MarkersExpected = s.hostedReconfig(q, h.Fragment)
		}
		req.Tasks = append(req.Tasks, it)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, max(s.cfg.Timings.PartnerTimeout/3, time.Second))
	ans, err := s.pool.Call(cctx, org, federation.Message{Kind: msgSync, From: s.cfg.Org, Body: body})
	cancel()
	if err == nil && ans.Kind != federation.MsgOK {
		err = fmt.Errorf("%w: %s", federation.ErrRefused, ans.Reason)
	}
	if err != nil {
		return err
	}
	var out syncAnswer
	if err := json.Unmarshal(ans.Body, &out); err != nil {
		return fmt.Errorf("sync answer of %s: %w", org, err)
	}
	if err := s.ensurePartnerWorker(ctx, org); err != nil {
		return err
	}
	upd := fsm.UpdateTaskStatesRequest{WorkerID: partnerWorkerID(org), KeepReconfig: s.keepReconfig()}
	for _, r := range out.Reports {
		s.xorg.setHostedLevel(r.TaskID, r.DataPlaneLevel)
		if r.State == "" {
			continue
		}
		u := fsm.TaskStateUpdate{TaskID: r.TaskID, Generation: r.Generation, State: r.State,
			Message: r.Message, MovePosition: r.MovePosition, MoveBlocked: r.MoveBlocked}
		r.Reconfig.fill(&u)
		upd.States = append(upd.States, u)
	}
	if len(upd.States) > 0 {
		if err := s.applyCmd(ctx, fsm.UpdateTaskStatesType, upd); err != nil {
			s.logger.Warn("applying a partner's task reports", "org", org, "err", err)
		}
	}
	s.endCaughtUpMoves(ctx, org, out.Reports, sent)
	s.xorg.noteCopies(org, req.Tasks, out, sent)
	for _, it := range out.Lost {
		s.lostAtPartner(ctx, org, it.TaskID, it.Generation)
	}
	return nil
}

// lostAtPartner brings home a task whose copy at org is gone while org
// itself is alive: a move to it rolls back, a return from it ends, and
// a task running there is placed at home again, as after the loss of a
// worker (from a live peer replica's snapshot, or replaying).
//
// gen is the generation of the copy lost; an answer about an older copy
// (a sync that listed a task before it moved again) changes nothing.
func (s *Server) lostAtPartner(ctx context.Context, org, taskID string, gen int) {
	pw := partnerWorkerID(org)
	rec, err := s.State().HostedTask(nil, s.cfg.Org, taskID)
	if err != nil || rec == nil || rec.Host != org || rec.Generation != gen {
		return
	}
	t, err := s.State().Task(nil, taskID)
	if err != nil || t == nil {
		return
	}
	if (t.WorkerID == pw && t.Gen() != gen) || (t.MovingFrom == pw && t.MovingFromGeneration != gen) {
		return
	}
	s.logger.Warn("a task's copy at a partner is gone: bringing it home", "task", taskID, "org", org)
	switch {
	case t.WorkerID == pw && t.MovingFrom != "":
		err = s.applyCmd(ctx, fsm.AbortMoveType, fsm.AbortMoveRequest{TaskID: t.ID, Generation: t.Gen(), Reason: "its copy at " + org + " is gone"})
	case t.MovingFrom == pw:
		err = s.applyCmd(ctx, fsm.UpdateTaskStatesType, fsm.UpdateTaskStatesRequest{WorkerID: t.WorkerID,
			States: []fsm.TaskStateUpdate{{TaskID: t.ID, Generation: t.Gen(), State: t.State, SwitchMove: true}}})
	case t.WorkerID == pw:
		workers, e1 := s.State().Workers(nil)
		tasks, e2 := s.State().Tasks(nil)
		if err = errors.Join(e1, e2); err != nil {
			break
		}
		p := newPlacer(workers, tasks)
		p.reserve(s.hostedLoad())
		to, why := p.pick(t)
		var out *planOutcome
		out, err = s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceReplace, StateIndex: s.State().LatestIndex(),
			Placements: []fsm.PlannedPlacement{{TaskID: t.ID, FromWorker: pw, FromGeneration: t.Gen(), ToWorker: to, Message: why}}})
		if err == nil && len(out.Result.Refused) > 0 {
			err = errors.New(out.Result.RefusedText())
		}
	}
	if err != nil && ctx.Err() == nil {
		s.logger.Warn("bringing home a task lost at a partner; the next sync retries", "task", taskID, "err", err)
	}
}

// partnerDead brings org's tasks home: moves out not yet ended are
// rolled back (their old copies run), returns under way end now (their
// home copies take over), and the partner worker goes down so the
// re-placement loop places the tasks that ran there at home.
func (s *Server) partnerDead(ctx context.Context, org string, recs []*fsm.HostedTask, cause error, failed bool) {
	s.logger.Warn("partner org is dead to this org: bringing its tasks home", "org", org, "failed_in_pool", failed, "err", cause, "tasks", len(recs))
	pw := partnerWorkerID(org)
	for _, h := range recs {
		t, err := s.State().Task(nil, h.TaskID)
		if err != nil || t == nil {
			continue
		}
		switch {
		case t.WorkerID == pw && t.MovingFrom != "":
			if err := s.applyCmd(ctx, fsm.AbortMoveType, fsm.AbortMoveRequest{TaskID: t.ID, Generation: t.Gen(), Reason: "partner " + org + " is unreachable"}); err != nil {
				s.logger.Warn("rolling back a move to a dead partner", "task", t.ID, "err", err)
			}
		case t.MovingFrom == pw:
			upd := fsm.UpdateTaskStatesRequest{WorkerID: t.WorkerID,
				States: []fsm.TaskStateUpdate{{TaskID: t.ID, Generation: t.Gen(), State: t.State, SwitchMove: true}}}
			if err := s.applyCmd(ctx, fsm.UpdateTaskStatesType, upd); err != nil {
				s.logger.Warn("ending a return from a dead partner", "task", t.ID, "err", err)
			}
		}
	}
	s.liveness.forget(pw)
	if err := s.applyCmd(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: pw, Status: statusDown, At: time.Now().UnixNano()}); err != nil {
		s.logger.Error("marking a dead partner down", "org", org, "err", err)
	}
}

// receiveMigration answers a partner's migration message on the leader.
func (s *Server) receiveMigration(ctx context.Context, m federation.Message) (federation.Message, error) {
	refuse := func(err error) (federation.Message, error) {
		return federation.Message{Kind: federation.MsgRefused, From: s.cfg.Org, Reason: err.Error()}, nil
	}
	switch m.Kind {
	case msgHost:
		var req hostRequest
		if err := json.Unmarshal(m.Body, &req); err != nil {
			return refuse(fmt.Errorf("host request: %v", err))
		}
		worker, err := s.hostTask(ctx, m.From, req)
		if err != nil {
			return refuse(err)
		}
		body, _ := json.Marshal(map[string]string{"worker": worker})
		return federation.Message{Kind: federation.MsgOK, From: s.cfg.Org, Body: body}, nil
	case msgSync:
		var req syncRequest
		if err := json.Unmarshal(m.Body, &req); err != nil {
			return refuse(fmt.Errorf("sync request: %v", err))
		}
		ans, err := s.syncHosted(ctx, m.From, req)
		if err != nil {
			return federation.Message{}, err
		}
		body, err := json.Marshal(ans)
		if err != nil {
			return federation.Message{}, err
		}
		return federation.Message{Kind: federation.MsgOK, From: s.cfg.Org, Body: body}, nil
	}
	return refuse(fmt.Errorf("unknown migration message %q", m.Kind))
}

// hostTask checks a partner's request against the contract in this
// org's Raft state and places the task on a worker of this org.
func (s *Server) hostTask(ctx context.Context, owner string, req hostRequest) (string, error) {
	h := req.Task
	if h.Owner != owner || h.Host != s.cfg.Org {
		return "", fmt.Errorf("a task of %s hosted at %s asked by %s", h.Owner, h.Host, owner)
	}
	if h.ID != fsm.HostedTaskID(owner, h.TaskID) || h.Generation < 2 || h.SourceGeneration < 1 || len(h.SpecJSON) == 0 {
		return "", fmt.Errorf("malformed host request for %s", h.TaskID)
	}
	var classes []string
	if req.Class != "" {
		classes = []string{req.Class}
	}
	st := s.State()
	if q, err := st.Query(nil, h.Query); err != nil {
		return "", err
	} else if q != nil {
		return "", fmt.Errorf("org %s runs a query named %s itself: it cannot host a task of %s's", s.cfg.Org, h.Query, owner)
	}
	hs, err := st.HostedTasks(nil)
	if err != nil {
		return "", err
	}
	for _, o := range hs {
		if o.Host == s.cfg.Org && o.Query == h.Query && o.Owner != owner {
			return "", fmt.Errorf("org %s hosts a query named %s for %s already", s.cfg.Org, h.Query, o.Owner)
		}
		if o.ID == h.ID && o.Generation == h.Generation && o.WorkerID != "" {
			s.xorg.touch(owner, time.Now())
			return o.WorkerID, nil // a retried request
		}
	}
	// The checks, the pick and the commit run in the plan applier's turn:
	// no plan places a task between them, and the applier's capacity
	// checks count the hosted task from then on.
	var picked string
	err = s.inApplier(ctx, func(ctx context.Context) error {
		// The contract's max load is checked in the same turn, so two
		// requests under one contract cannot both fit in its last room.
		if _, err := s.contractFor(h.Contract, owner, s.cfg.Org, classes, h.Load, h.TaskID); err != nil {
			return err
		}
		workers, err := st.Workers(nil)
		if err != nil {
			return err
		}
		tasks, err := st.Tasks(nil)
		if err != nil {
			return err
		}
		p := newPlacer(workers, tasks)
		p.reserve(s.hostedLoad())
		t := &fsm.Task{ID: h.TaskID, Query: owner + "/" + h.Query, Fragment: h.Fragment, Partition: h.Partition, Replica: h.Replica}
		w, why := p.pick(t)
		if w == "" {
			return fmt.Errorf("org %s cannot place %s: %s", s.cfg.Org, h.TaskID, why)
		}
		h.WorkerID, h.Phase, h.State, h.Message = w, fsm.HostedMoving, "", ""
		if err := s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: h}); err != nil {
			return err
		}
		picked = w
		return nil
	})
	if err != nil {
		return "", err
	}
	s.xorg.touch(owner, time.Now())
	s.logger.Info("hosting a partner's task", "owner", owner, "task", h.TaskID, "generation", h.Generation, "worker", picked, "contract", h.Contract)
	return picked, nil
}

// syncHosted answers an owner's sync: drops the tasks it no longer
// lists, follows its phases, and reports the copies.
func (s *Server) syncHosted(ctx context.Context, owner string, req syncRequest) (syncAnswer, error) {
	s.xorg.touch(owner, time.Now())
	want := map[string]syncItem{}
	for _, it := range req.Tasks {
		want[it.TaskID] = it
	}
	hs, err := s.State().HostedTasks(nil)
	if err != nil {
		return syncAnswer{}, err
	}
	ans := syncAnswer{ListsAbsent: true}
	here := map[string]bool{}
	// hosted: the generation of each task whose copy stays hosted here.
	hosted := map[string]int{}
	for _, h := range hs {
		if h.Owner != owner || h.Host != s.cfg.Org {
			continue
		}
		here[h.TaskID] = true
		it, ok := want[h.TaskID]
		if (!ok || it.Generation != h.Generation) && req.StateIndex < h.OwnerIndex {
			// Listed from the owner's state before it recorded this
			// copy's move: nothing said about the copy.
			continue
		}
		if !ok || it.Generation != h.Generation {
			s.logger.Info("the owner no longer runs this task here: dropping it", "owner", owner, "task", h.TaskID, "generation", h.Generation)
			if err := s.applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: h.ID, IfGeneration: h.Generation}); err != nil {
				return syncAnswer{}, err
			}
			continue
		}
		w, err := s.State().Worker(nil, h.WorkerID)
		if err != nil {
			return syncAnswer{}, err
		}
		if w == nil || w.Status == statusDown {
			s.logger.Warn("the worker of a hosted task is gone: dropping the task (its owner places it at home)", "owner", owner, "task", h.TaskID, "worker", h.WorkerID)
			if err := s.applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: h.ID, IfGeneration: h.Generation}); err != nil {
				return syncAnswer{}, err
			}
			ans.Lost = append(ans.Lost, syncItem{TaskID: h.TaskID, Generation: h.Generation})
			continue
		}
		phase := it.Phase != h.Phase && (it.Phase == fsm.HostedRunning || it.Phase == fsm.HostedReturning)
		reconfig := !bytes.Equal(it.Reconfig, h.ReconfigJSON) || it.MarkersExpected != h.MarkersExpected
		if phase || reconfig {
			// A plan the owner committed (or advanced) since: the copy
			// loads it from its assignment.
			upd := *h
			if phase {
				upd.Phase = it.Phase
			}
			upd.ReconfigJSON, upd.MarkersExpected = it.Reconfig, it.MarkersExpected
			if err := s.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: upd, IfGeneration: h.Generation}); err != nil {
				return syncAnswer{}, err
			}
		}
		hosted[h.TaskID] = h.Generation
		if r, ok := s.xorg.lastReport(h.ID); ok && r.Generation == h.Generation {
			r.DataPlaneLevel = w.DataPlaneLevel
			ans.Reports = append(ans.Reports, r)
		}
	}
	for _, it := range req.Tasks {
		if !here[it.TaskID] && it.Phase != fsm.HostedMoving {
			ans.Lost = append(ans.Lost, it)
		}
		if g, ok := hosted[it.TaskID]; !ok || g != it.Generation {
			ans.Absent = append(ans.Absent, it)
		}
	}
	return ans, nil
}

// hostedLoad counts, per worker of this org, the partners' tasks it
// hosts.
func (s *Server) hostedLoad() map[string]int {
	out := map[string]int{}
	hs, err := s.State().HostedTasks(nil)
	if err != nil {
		return out
	}
	for _, h := range hs {
		if h.Host == s.cfg.Org && h.WorkerID != "" {
			out[h.WorkerID]++
		}
	}
	return out
}

// expireHosted is a leader duty of the host side: the tasks of an owner
// silent past PartnerTimeout are dropped (the owner, on its side, brings
// them home).
func (s *Server) expireHosted(ctx context.Context) {
	if s.pool == nil {
		return
	}
	tick := time.NewTicker(syncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		hs, err := s.State().HostedTasks(nil)
		if err != nil {
			continue
		}
		now := time.Now()
		for _, h := range hs {
			if h.Host != s.cfg.Org {
				continue
			}
			if now.Sub(s.xorg.since(h.Owner, now)) <= s.cfg.Timings.PartnerTimeout {
				continue
			}
			s.logger.Warn("the owner of a hosted task has not synced within the partner timeout: dropping the task (its owner places it at home)",
				"owner", h.Owner, "task", h.TaskID, "timeout", s.cfg.Timings.PartnerTimeout)
			if err := s.applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: h.ID, IfGeneration: h.Generation}); err != nil && ctx.Err() == nil {
				s.logger.Warn("dropping a hosted task", "task", h.TaskID, "err", err)
			}
		}
	}
}

// hostedOn is the partners' tasks this org hosts on worker, by task id.
func (s *Server) hostedOn(workerID string) map[string]*fsm.HostedTask {
	hs, err := s.State().HostedTasks(nil)
	if err != nil || len(hs) == 0 {
		return nil
	}
	mine := map[string]*fsm.HostedTask{}
	for _, h := range hs {
		if h.Host == s.cfg.Org && h.WorkerID == workerID {
			mine[h.TaskID] = h
		}
	}
	return mine
}

// takeHostedReports keeps, on the host's leader, the reports of hosted
// copies from a worker's report and returns the others (the state
// machine knows no task of a partner's query).
func (s *Server) takeHostedReports(workerID string, in []*pb.TaskState) []*pb.TaskState {
	mine := s.hostedOn(workerID)
	if len(mine) == 0 {
		return in
	}
	var rest []*pb.TaskState
	for _, t := range in {
		h := mine[t.TaskId]
		if h == nil {
			rest = append(rest, t)
			continue
		}
		if int(t.Generation) == h.Generation {
			r := hostedReport{TaskID: t.TaskId, Generation: int(t.Generation), State: t.State, Message: t.Message,
				MovePosition: t.MovePosition, MoveBlocked: t.MoveBlocked, Reconfig: hostedReconfigOf(t.Reconfig)}
			s.xorg.report(h.ID, r)
		}
	}
	return rest
}

// hostedAssignments adds the partners' tasks this org hosts on worker to
// its assignments: each with the owner's query, whose tasks all show at
// this coordinator's org port (the relay to the owner).
func (s *Server) hostedAssignments(worker string, resp *pb.WatchAssignmentsResponse) {
	hs, err := s.State().HostedTasks(nil)
	if err != nil {
		return
	}
	relay := s.GRPCAddr()
	for _, h := range hs {
		if h.Host != s.cfg.Org || h.WorkerID != worker {
			continue
		}
		a := &pb.Assignment{TaskId: h.TaskID, Query: h.Query, Fragment: h.Fragment, Partition: int32(h.Partition), Replica: int32(h.Replica),
			QueryIndex: h.CreateIndex, Generation: int32(h.Generation), MovingOut: h.Phase == fsm.HostedReturning}
		if h.Phase == fsm.HostedMoving {
			a.Bootstrap = &pb.SnapshotSource{WorkerAddr: relay, TaskId: h.TaskID, Generation: int32(h.SourceGeneration), TimeoutMs: h.BootstrapTimeoutMs}
		}
		view := &pb.QueryView{Name: h.Query, Index: h.CreateIndex, SpecJson: h.SpecJSON, ReconfigJson: h.ReconfigJSON}
		a.MarkersExpected = int32(h.MarkersExpected)
		for _, p := range h.Peers {
			if p.TaskID == h.TaskID {
				continue
			}
			// Generation 0: the owner's data port routes to whichever
			// copy its consumers read.
			view.Tasks = append(view.Tasks, &pb.TaskPlacement{TaskId: p.TaskID, Fragment: p.Fragment, Partition: int32(p.Partition),
				Replica: int32(p.Replica), WorkerId: partnerWorkerID(h.Owner), WorkerAddr: relay})
		}
		view.Tasks = append(view.Tasks, &pb.TaskPlacement{TaskId: h.TaskID, Fragment: h.Fragment, Partition: int32(h.Partition),
			Replica: int32(h.Replica), WorkerId: worker, Generation: int32(h.Generation)})
		for _, m := range h.SlotMaps {
			pm := &pb.SlotMap{Fragment: m.Fragment, Epoch: m.Epoch, Partitions: int32(m.Partitions), Ranges: slotRangesPB(m.Ranges)}
			view.SlotMaps = append(view.SlotMaps, pm)
			if m.Fragment == h.Fragment {
				a.SlotEpoch = m.Epoch
				a.Slots = slotRangesPB(m.SlotsOf(h.Partition))
			}
		}
		resp.Assignments = append(resp.Assignments, a)
		resp.Queries = append(resp.Queries, view)
	}
}

// hostedReconfig is what a partner hosting a task of query q (fragment)
// needs of its live reconfiguration: the state's JSON (nil without one)
// and the task's marker count.
func (s *Server) hostedReconfig(q *fsm.Query, fragment string) ([]byte, int) {
	if q.Reconfig == nil {
		return nil, 0
	}
	b, err := json.Marshal(q.Reconfig)
	if err != nil {
		return nil, 0
	}
	n := 0
	if plan := s.plans.plan(q); plan != nil {
		maps, _ := s.State().SlotMaps(nil, q.Name)
		var cur []*fsm.SlotMap
		for _, m := range maps {
			if m.QueryIndex == q.CreateIndex {
				cur = append(cur, m)
			}
		}
		n = markersExpected(plan, fragment, cur)
	}
	return b, n
}

// hostedStateText is where a task runs, for status: the partner org for
// a task at a partner, "" otherwise.
func hostedStateText(h *fsm.HostedTask) string {
	switch h.Phase {
	case fsm.HostedMoving:
		return "moving to org " + h.Host
	case fsm.HostedReturning:
		return "returning from org " + h.Host
	}
	return "at org " + h.Host
}

// MigrateTask implements AdminService.MigrateTask (fedstream task move
// --to-org) on the leader.
func (as *adminService) MigrateTask(ctx context.Context, req *pb.MigrateTaskRequest) (*pb.MigrateTaskResponse, error) {
	if req.TaskId == "" || req.ToOrg == "" || req.Contract == "" {
		return nil, status.Error(codes.InvalidArgument, "move across orgs: a task id, a partner org and a contract id are required")
	}
	resp := &pb.MigrateTaskResponse{}
	if handled, err := as.s.leaderOrForward(ctx, adminMethod+"MigrateTask", req, resp); handled {
		return resp, err
	}
	if err := as.s.MigrateTaskOut(ctx, req.TaskId, req.ToOrg, req.Contract); err != nil {
		// A retry of a move that completed (its answer lost with a
		// leader) answers as the move did; a move to another org is
		// refused.
		if !errors.Is(err, ErrAtPartnerAlready) || as.s.TasksAtPartners()[req.TaskId] != req.ToOrg {
			return nil, migrationStatus(err)
		}
	}
	t, err := as.s.State().Task(nil, req.TaskId)
	if err != nil || t == nil {
		return nil, status.Errorf(codes.Internal, "move %s: read it back: %v", req.TaskId, err)
	}
	return &pb.MigrateTaskResponse{TaskId: t.ID, Org: req.ToOrg, Generation: int32(t.Gen())}, nil
}

// ReturnTask implements AdminService.ReturnTask (fedstream task return).
func (as *adminService) ReturnTask(ctx context.Context, req *pb.ReturnTaskRequest) (*pb.ReturnTaskResponse, error) {
	if req.TaskId == "" {
		return nil, status.Error(codes.InvalidArgument, "return: a task id is required")
	}
	resp := &pb.ReturnTaskResponse{}
	if handled, err := as.s.leaderOrForward(ctx, adminMethod+"ReturnTask", req, resp); handled {
		return resp, err
	}
	if err := as.s.ReturnTaskHome(ctx, req.TaskId); err != nil {
		return nil, migrationStatus(err)
	}
	t, err := as.s.State().Task(nil, req.TaskId)
	if err != nil || t == nil {
		return nil, status.Errorf(codes.Internal, "return %s: read it back: %v", req.TaskId, err)
	}
	return &pb.ReturnTaskResponse{TaskId: t.ID, WorkerId: t.WorkerID, Generation: int32(t.Gen())}, nil
}

// migrationStatus maps a migration's error to a gRPC status.
func migrationStatus(err error) error {
	switch {
	case errors.Is(err, ErrNoPlanApplier), errors.Is(err, errNoCrossOrgTransport):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	case errors.Is(err, federation.ErrNoContract):
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.FailedPrecondition, err.Error())
}

// placedAt fills where a task at a partner runs, for status.
func placedAt(ti *pb.TaskInfo, hosted map[string]*fsm.HostedTask) {
	if h := hosted[ti.TaskId]; h != nil {
		// WorkerAddr stays the partner worker's: this org's coordinator
		// relaying the task's streams (fedstream tail reads a sink there).
		ti.Org, ti.OrgPhase = h.Host, h.Phase
		if ti.Message == "" {
			ti.Message = hostedStateText(h)
		}
	}
}
