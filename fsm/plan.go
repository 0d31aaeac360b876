package fsm

import (
	"fmt"
	"strings"
)

// Plans: the one way placements and slot ownership change.
//
// Every manager that wants tasks to run somewhere else (query submit, the
// re-placement of tasks whose worker was lost, and later moves, rescales,
// the health, load and reconfiguration managers) builds an
// ApplyPlanRequest from the state it read and hands it to the leader's
// plan applier (coordinator package). The applier serialises plans,
// re-checks each against the current state and proposes the valid part as
// one ApplyPlan log entry. Apply below checks again what it can check
// deterministically, so a stale plan that slipped past the applier (or a
// log written by a buggy leader) cannot break the invariants:
//
//   - a placement names a task that exists, on the worker and at the
//     generation the plan expected (two managers racing on one task:
//     the first plan to commit wins, the other is refused as stale);
//   - the target worker is registered and ready;
//   - no worker runs two replicas of one partition;
//   - no worker runs more than TasksPerCore tasks per core (when set);
//   - a replica goes to a zone (worker label ZoneLabel, when set) that
//     runs none of its partition yet if a ready worker with room in such
//     a zone exists;
//   - a slot map covers every slot exactly once, names partitions that
//     exist, and replaces the epoch the plan expected.

// Plan sources: who submitted a plan (logged, and kept in the result).
const (
	PlanSourceSubmit   = "submit"
	PlanSourceReplace  = "replace"
	PlanSourceMove     = "move"
	PlanSourceRescale  = "rescale"
	PlanSourceHealth   = "health"
	PlanSourceLoad     = "load"
	PlanSourceReconfig = "reconfig"
	// PlanSourceRebootstrap: a lossy DCAA replica replaced by a copy
	// bootstrapped from a STABLE peer (coordinator rebootstrapLossy).
	PlanSourceRebootstrap = "rebootstrap"
)

// NumSlots is the number of hash slots of a keyed fragment; it equals
// queryspec.NumSlots (a coordinator test checks), restated here so the
// state machine does not depend on the query parser.
const NumSlots = 4096

// SlotRange gives the slots First..Last (inclusive) to one partition.
type SlotRange struct {
	First     int `json:"first"`
	Last      int `json:"last"`
	Partition int `json:"partition"`
}

// SlotMap is the replicated owner of every hash slot of one keyed
// fragment: which partition's task processes (and keeps the state of) the
// keys hashing to each slot. Epoch starts at 1 when the map is created
// and grows by one on every reassignment, so a task can tell which
// version of the map its slot set comes from.
type SlotMap struct {
	Query    string `json:"query"`
	Fragment string `json:"fragment"`
	// QueryIndex is the CreateIndex of the query definition the map
	// belongs to: a resubmitted query starts with new maps.
	QueryIndex uint64 `json:"query_index"`
	Partitions int    `json:"partitions"`
	Epoch      uint64 `json:"epoch"`
	// Ranges cover 0..NumSlots-1 in order, each slot exactly once.
	Ranges []SlotRange `json:"ranges"`
	// Next is the rescale under way, nil when none is (see SlotMapNext).
	Next *SlotMapNext `json:"next,omitempty"`
	// Starts is set for a generator source fragment that a live rescale
	// gave partitions (its map then counts its partitions; its slots mean
	// nothing): per partition, the stream time its stream starts at,
	// math.MinInt64 for the whole stream (a partition the fragment had
	// from the start), the cut of the rescale that added it otherwise.
	// A restarted copy starts there. Protocol 9.
	Starts      []int64 `json:"starts,omitempty"`
	CreateIndex uint64  `json:"create_index"`
	ModifyIndex uint64  `json:"modify_index"`
}

// SlotMapNext is a live rescale of a keyed fragment in progress: the map
// it moves to (epoch Epoch = the map's epoch + 1) and, once every task
// involved holds, the cut. Phases, each one plan:
//
//   - prepare: Next is set (Go false). Every task that routes to the
//     fragment, runs it, or reads it stops producing and releasing where
//     it is and reports its frontier (Task.Prepared, Task.Frontier);
//     tasks of added partitions are created and placed.
//   - go: Cut is a stream time above every reported frontier. Upstream
//     tasks route a tuple by Ranges when its stime is at or above Cut and
//     by the current map below it; the fragment's tasks release exactly
//     the tuples below Cut, hand the slots they lose to their new owners
//     and install the slots they gain, then continue (Task.CutDone).
//   - finish: the map becomes Next (its epoch, partitions and ranges),
//     Next is cleared and the tasks of removed partitions are deleted.
//
// A prepare that cannot complete is aborted (Next cleared) before go;
// after go the rescale only goes forward.
type SlotMapNext struct {
	Epoch      uint64      `json:"epoch"`
	Partitions int         `json:"partitions"`
	Ranges     []SlotRange `json:"ranges"`
	Go         bool        `json:"go,omitempty"`
	Cut        int64       `json:"cut,omitempty"`
}

// Slot map update phases (SlotMapUpdate.Phase); "" replaces the map.
const (
	RescalePrepare = "prepare"
	RescaleGo      = "go"
	RescaleFinish  = "finish"
	RescaleAbort   = "abort"
)

// Owners expands the map into one partition per slot (len NumSlots).
func (m *SlotMap) Owners() []int {
	out := make([]int, NumSlots)
	for _, r := range m.Ranges {
		for s := max(r.First, 0); s <= r.Last && s < NumSlots; s++ {
			out[s] = r.Partition
		}
	}
	return out
}

// SlotsOf returns the ranges owned by one partition, in slot order.
func (m *SlotMap) SlotsOf(partition int) []SlotRange {
	var out []SlotRange
	for _, r := range m.Ranges {
		if r.Partition == partition {
			out = append(out, r)
		}
	}
	return out
}

// RangesOf compresses a slot -> partition table into ranges.
func RangesOf(owners []int) []SlotRange {
	var out []SlotRange
	for s, p := range owners {
		if n := len(out); n > 0 && out[n-1].Partition == p && out[n-1].Last == s-1 {
			out[n-1].Last = s
			continue
		}
		out = append(out, SlotRange{First: s, Last: s, Partition: p})
	}
	return out
}

// ContiguousSlotMap is the map every keyed fragment starts with: slot s
// belongs to partition s*partitions/NumSlots, the formula the data plane
// used before slot maps were replicated (queryspec.PartitionOfSlot).
func ContiguousSlotMap(partitions int) []SlotRange {
	partitions = max(partitions, 1)
	owners := make([]int, NumSlots)
	for s := range owners {
		owners[s] = s * partitions / NumSlots
	}
	return RangesOf(owners)
}

// CheckSlotRanges returns why ranges are not a valid map of NumSlots slots
// to partitions 0..partitions-1, or "" if they are.
func CheckSlotRanges(ranges []SlotRange, partitions int) string {
	if partitions < 1 {
		return fmt.Sprintf("slot map has %d partitions, want at least 1", partitions)
	}
	next := 0
	for _, r := range ranges {
		if r.First != next || r.Last < r.First {
			return fmt.Sprintf("slot ranges must cover 0..%d in order without gaps or overlaps: range %d..%d after slot %d", NumSlots-1, r.First, r.Last, next-1)
		}
		if r.Partition < 0 || r.Partition >= partitions {
			return fmt.Sprintf("slot range %d..%d names partition %d of %d", r.First, r.Last, r.Partition, partitions)
		}
		next = r.Last + 1
	}
	if next != NumSlots {
		return fmt.Sprintf("slot ranges cover 0..%d, want 0..%d", next-1, NumSlots-1)
	}
	return ""
}

// PlannedPlacement is one placement change of a plan: the task, where and
// at which generation the planner saw it (the plan is refused for this
// task if it is no longer there), and where it should run ("" unplaces
// it). A placement with FromWorker and ToWorker both "" only records, as
// the waiting task's Message, why it is still unplaced.
type PlannedPlacement struct {
	TaskID         string `json:"task_id"`
	FromWorker     string `json:"from_worker"`
	FromGeneration int    `json:"from_generation"`
	ToWorker       string `json:"to_worker"`
	// Live makes it a live move: the copy on FromWorker keeps running,
	// moving out (Task.MovingFrom), until the new copy reports running;
	// the new copy starts from its snapshot.
	Live bool `json:"live,omitempty"`
	// CatchUp (with Live) keeps the old copy serving consumers until the
	// new copy has also caught up with it (Task.MoveCatchUp). Protocol 5.
	CatchUp bool `json:"catch_up,omitempty"`
	// Halt (with Live) makes the move stop-and-copy: the new copy's
	// snapshot halts the old copy (Task.MoveHalt). Protocol 12.
	Halt bool `json:"halt,omitempty"`
	// Message becomes the task's Message: for an unplaced task, why it
	// waits.
	Message string `json:"message,omitempty"`
}

// SlotMapUpdate creates or replaces the slot map of one keyed fragment.
// ExpectedEpoch is the epoch the planner saw (0: no map yet); the update
// is refused if the map has moved on since.
type SlotMapUpdate struct {
	Query         string      `json:"query"`
	Fragment      string      `json:"fragment"`
	QueryIndex    uint64      `json:"query_index"`
	ExpectedEpoch uint64      `json:"expected_epoch"`
	Partitions    int         `json:"partitions"`
	Ranges        []SlotRange `json:"ranges"`
	// Phase makes the update a step of a live rescale (Rescale*; see
	// SlotMapNext): prepare sets Next to Partitions and Ranges, go sets
	// its Cut, finish installs it, abort drops it. ExpectedEpoch is the
	// current map's epoch in every phase.
	Phase string `json:"phase,omitempty"`
	Cut   int64  `json:"cut,omitempty"`
	// Starts, on the finish of a generator source's rescale, becomes the
	// map's Starts (see SlotMap.Starts). Protocol 9.
	Starts []int64 `json:"starts,omitempty"`
}

// PlannedTask is a task a plan creates (a partition a rescale adds),
// unplaced: a placement of the same plan places it.
type PlannedTask struct {
	Query     string `json:"query"`
	Fragment  string `json:"fragment"`
	Partition int    `json:"partition"`
	Replica   int    `json:"replica"`
	// ScaleEpoch is the slot-map epoch the task is created for; its first
	// copy has that generation (see Task.ScaleEpoch).
	ScaleEpoch uint64 `json:"scale_epoch"`
}

// ApplyPlanRequest is a plan as the leader's plan applier commits it:
// placements applied in order (each checked against the state left by the
// ones before), then slot map updates. Parts that fail a check are
// refused with their reason and the rest is applied; the entry as a whole
// is rejected only when the request is malformed. Value: *PlanResult.
type ApplyPlanRequest struct {
	// Source names the manager that built the plan (PlanSource*).
	Source string `json:"source"`
	// StateIndex is the state index (StateStore.LatestIndex) the plan was
	// computed at; informational, for logs.
	StateIndex uint64 `json:"state_index"`
	// NewTasks are created (unplaced) before the placements apply.
	NewTasks   []PlannedTask      `json:"new_tasks,omitempty"`
	Placements []PlannedPlacement `json:"placements,omitempty"`
	SlotMaps   []SlotMapUpdate    `json:"slot_maps,omitempty"`
	// RemoveTasks are deleted after the slot maps apply (the partitions a
	// finished rescale removed).
	RemoveTasks []string `json:"remove_tasks,omitempty"`
	// TasksPerCore bounds the tasks a worker may run per core it reported
	// (at least one core counts); 0 leaves capacity unchecked. Carried in
	// the entry so that every node checks the same bound.
	TasksPerCore int `json:"tasks_per_core,omitempty"`
	// ZoneLabel is the worker label replicas of a partition spread over;
	// "" leaves zone spread unchecked.
	ZoneLabel string `json:"zone_label,omitempty"`
}

// Protocol returns the replication protocol a coordinator needs to apply
// the plan exactly as the leader does: fields added after protocol 3
// (live moves, rescale phases, created and removed tasks) would be
// ignored by an older build, which would then hold another state.
func (r *ApplyPlanRequest) Protocol() int {
	v := 3
	if len(r.NewTasks) > 0 || len(r.RemoveTasks) > 0 {
		v = 4
	}
	for _, p := range r.Placements {
		if p.Live && p.Halt {
			return HaltMoveProtocol
		}
	}
	for _, p := range r.Placements {
		if p.CatchUp {
			return 5
		}
		if p.Live {
			v = 4
		}
	}
	for _, u := range r.SlotMaps {
		if len(u.Starts) > 0 {
			return 9
		}
		if u.Phase != "" {
			v = 4
		}
	}
	return v
}

// PlanRefusal is one refused part of a plan.
type PlanRefusal struct {
	TaskID string `json:"task_id,omitempty"`
	// Fragment and Query name a refused slot map update.
	Query    string `json:"query,omitempty"`
	Fragment string `json:"fragment,omitempty"`
	Reason   string `json:"reason"`
}

func (r PlanRefusal) String() string {
	if r.TaskID != "" {
		return r.TaskID + ": " + r.Reason
	}
	return r.Query + "/" + r.Fragment + " slot map: " + r.Reason
}

// PlanResult reports what an ApplyPlan entry did.
type PlanResult struct {
	// Placed lists the tasks whose worker changed, in plan order.
	Placed []string `json:"placed,omitempty"`
	// SlotMaps lists the slot maps written, as "query/fragment@epoch",
	// followed by " (rescale PHASE)" for a rescale step.
	SlotMaps []string `json:"slot_maps,omitempty"`
	// Created and Removed list the tasks the plan created and deleted.
	Created []string      `json:"created,omitempty"`
	Removed []string      `json:"removed,omitempty"`
	Refused []PlanRefusal `json:"refused,omitempty"`
}

// RefusedText joins the refusals for a log line or an error.
func (r *PlanResult) RefusedText() string {
	parts := make([]string, len(r.Refused))
	for i, f := range r.Refused {
		parts[i] = f.String()
	}
	return strings.Join(parts, "; ")
}

func where(worker string) string {
	if worker == "" {
		return "unplaced"
	}
	return "on worker " + worker
}

// checkPlacement returns why p cannot be applied to the current state of
// tx ("" if it can) and the task it names (nil if absent).
func (tx *writeTx) checkPlacement(p *PlannedPlacement, tasksPerCore int, zoneLabel string) (string, *Task, error) {
	t, err := txFirst[Task](tx, TableTasks, p.TaskID)
	if err != nil {
		return "", nil, err
	}
	if t == nil {
		return fmt.Sprintf("task %s does not exist (its query was stopped or resubmitted)", p.TaskID), nil, nil
	}
	if p.FromGeneration < 1 {
		return "the plan does not say which generation of the task it expects", t, nil
	}
	if t.WorkerID != p.FromWorker || t.Gen() != p.FromGeneration {
		return fmt.Sprintf("stale plan: the task is %s at generation %d, the plan expected it %s at generation %d (another plan changed it first)",
			where(t.WorkerID), t.Gen(), where(p.FromWorker), p.FromGeneration), t, nil
	}
	if p.ToWorker == "" || p.ToWorker == t.WorkerID {
		return "", t, nil
	}
	w, err := txFirst[Worker](tx, TableWorkers, p.ToWorker)
	if err != nil {
		return "", t, err
	}
	if w == nil {
		return fmt.Sprintf("worker %s is not registered", p.ToWorker), t, nil
	}
	if w.Status != WorkerStatusReady {
		return fmt.Sprintf("worker %s is %s, not %s", w.ID, w.Status, WorkerStatusReady), t, nil
	}
	onWorker, err := txList[Task](tx, TableTasks, indexWorker, w.ID)
	if err != nil {
		return "", t, err
	}
	for _, o := range onWorker {
		if o.ID != t.ID && o.Query == t.Query && o.Fragment == t.Fragment && o.Partition == t.Partition {
			return fmt.Sprintf("worker %s already runs %s, a replica of the same partition (replicas of a partition run on different workers)", w.ID, o.ID), t, nil
		}
	}
	if tasksPerCore > 0 {
		cores := max(int(w.Cores), 1)
		if len(onWorker) >= cores*tasksPerCore {
			return fmt.Sprintf("worker %s is at capacity: %d tasks on %d cores (%d tasks per core)", w.ID, len(onWorker), cores, tasksPerCore), t, nil
		}
	}
	if zone := w.Labels[zoneLabel]; zoneLabel != "" && zone != "" {
		why, err := tx.checkZoneSpread(t, zone, zoneLabel, tasksPerCore)
		return why, t, err
	}
	return "", t, nil
}

// checkZoneSpread returns why t may not go to zone: another replica of its
// partition runs there while a ready worker with room in a zone running
// none could take it ("" otherwise).
func (tx *writeTx) checkZoneSpread(t *Task, zone, zoneLabel string, tasksPerCore int) (string, error) {
	replicas, err := txList[Task](tx, TableTasks, indexQuery, t.Query)
	if err != nil {
		return "", err
	}
	taken := map[string]bool{}
	hosts := map[string]bool{}
	for _, o := range replicas {
		if o.ID == t.ID || o.WorkerID == "" || o.Fragment != t.Fragment || o.Partition != t.Partition {
			continue
		}
		hosts[o.WorkerID] = true
		h, err := txFirst[Worker](tx, TableWorkers, o.WorkerID)
		if err != nil {
			return "", err
		}
		if h != nil && h.Labels[zoneLabel] != "" {
			taken[h.Labels[zoneLabel]] = true
		}
	}
	if !taken[zone] {
		return "", nil
	}
	workers, err := txList[Worker](tx, TableWorkers, indexID)
	if err != nil {
		return "", err
	}
	for _, alt := range workers {
		az := alt.Labels[zoneLabel]
		if alt.Status != WorkerStatusReady || az == "" || taken[az] || hosts[alt.ID] {
			continue
		}
		if tasksPerCore > 0 {
			load, err := txList[Task](tx, TableTasks, indexWorker, alt.ID)
			if err != nil {
				return "", err
			}
			if len(load) >= max(int(alt.Cores), 1)*tasksPerCore {
				continue
			}
		}
		return fmt.Sprintf("zone spread: zone %s already runs a replica of partition %d of %s, while worker %s in zone %s could run it", zone, t.Partition, t.Fragment, alt.ID, az), nil
	}
	return "", nil
}

// checkSlotMap returns why u cannot be applied ("" if it can) and the
// epoch the new map gets.
func (tx *writeTx) checkSlotMap(u *SlotMapUpdate) (string, uint64, error) {
	q, err := txFirst[Query](tx, TableQueries, u.Query)
	if err != nil {
		return "", 0, err
	}
	if q == nil || q.Status != QueryStatusRunning {
		return fmt.Sprintf("query %s is not running", u.Query), 0, nil
	}
	if q.CreateIndex != u.QueryIndex {
		return fmt.Sprintf("the slot map is for definition %d of query %s, which now runs definition %d", u.QueryIndex, u.Query, q.CreateIndex), 0, nil
	}
	if u.Fragment == "" {
		return "the slot map names no fragment", 0, nil
	}
	if why := CheckSlotRanges(u.Ranges, u.Partitions); why != "" {
		return why, 0, nil
	}
	cur, err := txFirst[SlotMap](tx, TableSlotMaps, u.Query, u.Fragment)
	if err != nil {
		return "", 0, err
	}
	epoch := uint64(0)
	if cur != nil && cur.QueryIndex == u.QueryIndex {
		epoch = cur.Epoch
	}
	if u.ExpectedEpoch != epoch {
		return fmt.Sprintf("stale plan: the slot map of %s is at epoch %d, the plan expected epoch %d (another plan changed it first)", u.Fragment, epoch, u.ExpectedEpoch), 0, nil
	}
	if why := RescalePhaseCheck(cur, u); why != "" {
		return why, 0, nil
	}
	return "", epoch + 1, nil
}

// RescalePhaseCheck returns why a slot map update's rescale phase does not
// follow from the current map cur ("" if it does; cur nil: no map).
func RescalePhaseCheck(cur *SlotMap, u *SlotMapUpdate) string {
	var next *SlotMapNext
	if cur != nil {
		next = cur.Next
	}
	switch u.Phase {
	case "":
		if next != nil {
			return fmt.Sprintf("a rescale of %s to epoch %d is under way", u.Fragment, next.Epoch)
		}
	case RescalePrepare:
		if cur == nil {
			return fmt.Sprintf("fragment %s has no slot map to rescale yet", u.Fragment)
		}
		if next != nil {
			return fmt.Sprintf("a rescale of %s to epoch %d is already under way", u.Fragment, next.Epoch)
		}
	case RescaleGo, RescaleAbort:
		if next == nil || next.Go {
			return fmt.Sprintf("no rescale of %s is being prepared", u.Fragment)
		}
	case RescaleFinish:
		if next == nil || !next.Go {
			return fmt.Sprintf("no rescale of %s has passed its cut", u.Fragment)
		}
	default:
		return fmt.Sprintf("unknown rescale phase %q", u.Phase)
	}
	return ""
}

// nextSlotMap returns the map u makes of cur at index (epoch: the epoch a
// plain replacement gets).
func nextSlotMap(cur *SlotMap, u *SlotMapUpdate, epoch, index uint64) *SlotMap {
	if u.Phase == "" {
		return &SlotMap{Query: u.Query, Fragment: u.Fragment, QueryIndex: u.QueryIndex, Partitions: u.Partitions,
			Epoch: epoch, Ranges: append([]SlotRange(nil), u.Ranges...), CreateIndex: index, ModifyIndex: index}
	}
	m := *cur
	m.ModifyIndex = index
	switch u.Phase {
	case RescalePrepare:
		m.Next = &SlotMapNext{Epoch: cur.Epoch + 1, Partitions: u.Partitions, Ranges: append([]SlotRange(nil), u.Ranges...)}
	case RescaleGo:
		n := *cur.Next
		n.Go, n.Cut = true, u.Cut
		m.Next = &n
	case RescaleFinish:
		m.Epoch, m.Partitions, m.Ranges, m.Next = cur.Next.Epoch, cur.Next.Partitions, cur.Next.Ranges, nil
		if u.Starts != nil {
			m.Starts = append([]int64(nil), u.Starts...)
		}
	case RescaleAbort:
		m.Next = nil
	}
	return &m
}

func (r *ApplyPlanRequest) apply(tx *writeTx) (any, error) {
	if r.Source == "" {
		return nil, invalid("apply plan: no source")
	}
	if r.TasksPerCore < 0 {
		return nil, invalid("apply plan from %s: negative tasks per core %d", r.Source, r.TasksPerCore)
	}
	// Every query the plan touches: the views of their hosts may change.
	queries := stringSet{}
	for _, p := range r.Placements {
		t, err := txFirst[Task](tx, TableTasks, p.TaskID)
		if err != nil {
			return nil, err
		}
		if t != nil {
			queries.add(t.Query)
		}
	}
	for _, u := range r.SlotMaps {
		queries.add(u.Query)
	}
	for _, nt := range r.NewTasks {
		queries.add(nt.Query)
	}
	for _, id := range r.RemoveTasks {
		if t, err := txFirst[Task](tx, TableTasks, id); err != nil {
			return nil, err
		} else if t != nil {
			queries.add(t.Query)
		}
	}
	affected := stringSet{}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	res := &PlanResult{}
	viewChanged := false
	for _, nt := range r.NewTasks {
		why, err := tx.checkNewTask(nt)
		if err != nil {
			return nil, err
		}
		if why != "" {
			res.Refused = append(res.Refused, PlanRefusal{TaskID: TaskID(nt.Query, nt.Fragment, nt.Partition, nt.Replica), Reason: why})
			continue
		}
		t := &Task{ID: TaskID(nt.Query, nt.Fragment, nt.Partition, nt.Replica), Query: nt.Query, Fragment: nt.Fragment,
			Partition: nt.Partition, Replica: nt.Replica, Generation: max(int(nt.ScaleEpoch), 1), ScaleEpoch: nt.ScaleEpoch,
			State: TaskStatePending, CreateIndex: tx.index, ModifyIndex: tx.index}
		if err := tx.insert(TableTasks, t); err != nil {
			return nil, err
		}
		res.Created = append(res.Created, t.ID)
	}
	for i := range r.Placements {
		p := &r.Placements[i]
		why, t, err := tx.checkPlacement(p, r.TasksPerCore, r.ZoneLabel)
		if err != nil {
			return nil, err
		}
		if why != "" {
			res.Refused = append(res.Refused, PlanRefusal{TaskID: p.TaskID, Reason: why})
			// A task left waiting says why (query status shows it).
			if t != nil && t.WorkerID == "" && t.Message != why {
				if err := tx.setTaskMessage(t, why); err != nil {
					return nil, err
				}
			}
			continue
		}
		if p.ToWorker == t.WorkerID {
			if t.WorkerID == "" && t.Message != p.Message {
				// Still waiting, for a new reason: no view changes.
				if err := tx.setTaskMessage(t, p.Message); err != nil {
					return nil, err
				}
			}
			continue
		}
		updated := *t
		updated.Generation = t.Gen()
		if t.WorkerID != "" {
			// The copy on t.WorkerID ends; the next one is a new copy.
			updated.Generation++
		}
		updated.resetReconfig()
		updated.endMove()
		// The next copy starts exact (from a peer that is not lossy, or
		// replaying): what the previous copy reported no longer holds.
		updated.Lossy = false
		if p.Live && t.WorkerID != "" && p.ToWorker != "" {
			updated.MovingFrom, updated.MovingFromGeneration = t.WorkerID, t.Gen()
			updated.MoveCatchUp = p.CatchUp
			updated.MoveHalt = p.Halt
		}
		updated.WorkerID = p.ToWorker
		updated.State = TaskStatePending
		updated.Message = p.Message
		updated.ModifyIndex = tx.index
		if err := tx.insert(TableTasks, &updated); err != nil {
			return nil, err
		}
		res.Placed = append(res.Placed, p.TaskID)
		viewChanged = true
	}
	for i := range r.SlotMaps {
		u := &r.SlotMaps[i]
		why, epoch, err := tx.checkSlotMap(u)
		if err != nil {
			return nil, err
		}
		if why != "" {
			res.Refused = append(res.Refused, PlanRefusal{Query: u.Query, Fragment: u.Fragment, Reason: why})
			continue
		}
		cur, err := txFirst[SlotMap](tx, TableSlotMaps, u.Query, u.Fragment)
		if err != nil {
			return nil, err
		}
		m := nextSlotMap(cur, u, epoch, tx.index)
		if err := tx.insert(TableSlotMaps, m); err != nil {
			return nil, err
		}
		res.SlotMaps = append(res.SlotMaps, fmt.Sprintf("%s/%s@%d", m.Query, m.Fragment, m.Epoch)+phaseNote(u.Phase))
		viewChanged = true
	}
	for _, id := range r.RemoveTasks {
		t, err := txFirst[Task](tx, TableTasks, id)
		if err != nil {
			return nil, err
		}
		if t == nil {
			continue
		}
		if err := tx.delete(TableTasks, t); err != nil {
			return nil, err
		}
		res.Removed = append(res.Removed, id)
		viewChanged = true
	}
	if !viewChanged {
		return res, nil
	}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	return res, tx.bumpAssignIndex(affected)
}

func phaseNote(phase string) string {
	if phase == "" {
		return ""
	}
	return " (rescale " + phase + ")"
}

// checkNewTask returns why a task cannot be created ("" if it can).
func (tx *writeTx) checkNewTask(nt PlannedTask) (string, error) {
	q, err := txFirst[Query](tx, TableQueries, nt.Query)
	if err != nil {
		return "", err
	}
	if q == nil || q.Status != QueryStatusRunning {
		return fmt.Sprintf("query %s is not running", nt.Query), nil
	}
	if nt.Fragment == "" || nt.Partition < 0 || nt.Replica < 0 || nt.ScaleEpoch == 0 {
		return fmt.Sprintf("task %s/p%d/r%d: a created task needs a fragment, a partition and replica >= 0 and the epoch it is for", nt.Fragment, nt.Partition, nt.Replica), nil
	}
	t, err := txFirst[Task](tx, TableTasks, TaskID(nt.Query, nt.Fragment, nt.Partition, nt.Replica))
	if err != nil {
		return "", err
	}
	if t != nil {
		return fmt.Sprintf("task %s already exists", t.ID), nil
	}
	return "", nil
}

// setTaskMessage changes only a task's Message.
func (tx *writeTx) setTaskMessage(t *Task, msg string) error {
	updated := *t
	updated.Message = msg
	updated.ModifyIndex = tx.index
	return tx.insert(TableTasks, &updated)
}

// deleteSlotMapsOf deletes the slot maps of a query (stopped or replaced).
func (tx *writeTx) deleteSlotMapsOf(query string) error {
	n, err := tx.txn.DeleteAll(TableSlotMaps, indexQuery, query)
	if err != nil {
		return fmt.Errorf("delete slot maps of %q: %w", query, err)
	}
	if n > 0 {
		tx.touched[TableSlotMaps] = struct{}{}
	}
	return nil
}
