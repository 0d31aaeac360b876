package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

type step struct {
	typ     MessageType
	body    any
	wantErr error
}

// TestCommands applies each command type (and its rejections) on a fixture
// of four workers, checks the effect, and checks that the resulting state
// survives Snapshot -> Persist -> Restore unchanged.
func TestCommands(t *testing.T) {
	submitQ1 := step{typ: SubmitQueryType, body: SubmitQueryRequest{
		Query: Query{Name: "q1", SpecJSON: []byte(`{"name":"q1"}`), Replicas: 2, MaxDelay: "2s"},
		Tasks: []Task{task("q1", "f0", 0, 0, "a"), task("q1", "f0", 0, 1, "b"), task("q1", "f1", 0, 0, "")},
	}}
	hash := HashSecret("s3cret")
	cases := []struct {
		name  string
		steps []step
		check func(t *testing.T, h *harness)
	}{
		{
			name: "register worker",
			steps: []step{{typ: RegisterWorkerType, body: RegisterWorkerRequest{Worker: Worker{
				ID: "e", Name: "e", Org: "org1", Addr: "127.0.0.1:9", Cores: 8, Labels: map[string]string{"zone": "z1"}}}}},
			check: func(t *testing.T, h *harness) {
				w := h.worker("e")
				if w.Status != WorkerStatusReady || w.Cores != 8 || w.Labels["zone"] != "z1" || w.AssignIndex != w.CreateIndex || w.CreateIndex != h.index {
					t.Fatalf("worker = %+v", w)
				}
			},
		},
		{
			name:  "re-register keeps create and assign index",
			steps: []step{{typ: RegisterWorkerType, body: RegisterWorkerRequest{Worker: Worker{ID: "d", Addr: "127.0.0.1:4", Cores: 2}}}},
			check: func(t *testing.T, h *harness) {
				w := h.worker("d")
				if w.CreateIndex != 4 || w.AssignIndex != 4 || w.ModifyIndex != h.index || w.Cores != 2 {
					t.Fatalf("worker = %+v", w)
				}
			},
		},
		{
			name: "register rejects bad input",
			steps: []step{
				{typ: RegisterWorkerType, body: RegisterWorkerRequest{Worker: Worker{}}, wantErr: ErrInvalidRequest},
				{typ: RegisterWorkerType, body: RegisterWorkerRequest{Worker: Worker{ID: "x", Status: "sleepy"}}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				if w, _ := h.state().Worker(nil, "x"); w != nil {
					t.Fatalf("rejected worker stored: %+v", w)
				}
			},
		},
		{
			name: "set worker status",
			steps: []step{
				{typ: SetWorkerStatusType, body: SetWorkerStatusRequest{WorkerID: "a", Status: WorkerStatusDown}},
				{typ: SetWorkerStatusType, body: SetWorkerStatusRequest{WorkerID: "zz", Status: WorkerStatusDown}, wantErr: ErrWorkerNotFound},
				{typ: SetWorkerStatusType, body: SetWorkerStatusRequest{WorkerID: "a", Status: "gone"}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				if w := h.worker("a"); w.Status != WorkerStatusDown || w.ModifyIndex != 5 {
					t.Fatalf("worker = %+v", w)
				}
			},
		},
		{
			name:  "submit query",
			steps: []step{submitQ1},
			check: func(t *testing.T, h *harness) {
				q, _ := h.state().Query(nil, "q1")
				if q == nil || q.Status != QueryStatusRunning || q.Replicas != 2 || string(q.SpecJSON) != `{"name":"q1"}` {
					t.Fatalf("query = %+v", q)
				}
				tasks, _ := h.state().TasksByQuery(nil, "q1")
				if len(tasks) != 3 || tasks[0].State != TaskStatePending {
					t.Fatalf("tasks = %+v", tasks)
				}
				unplaced, _ := h.state().TasksByWorker(nil, "")
				if len(unplaced) != 1 || unplaced[0].ID != "q1/f1/p0/r0" {
					t.Fatalf("unplaced = %+v", unplaced)
				}
			},
		},
		{
			name: "submit query rejections",
			steps: []step{
				submitQ1,
				{typ: SubmitQueryType, body: SubmitQueryRequest{Query: Query{Name: "q1"}}, wantErr: ErrQueryExists},
				{typ: SubmitQueryType, body: SubmitQueryRequest{Query: Query{Name: "q2"}, Tasks: []Task{{ID: "wrong", Fragment: "f"}}}, wantErr: ErrInvalidRequest},
				{typ: SubmitQueryType, body: SubmitQueryRequest{Query: Query{Name: "q2"}, Tasks: []Task{task("q2", "f", 0, 0, "nobody")}}, wantErr: ErrWorkerNotFound},
				{typ: SubmitQueryType, body: SubmitQueryRequest{Query: Query{Name: "q2"}, Tasks: []Task{task("q2", "f", 0, 0, ""), task("q2", "f", 0, 0, "")}}, wantErr: ErrInvalidRequest},
				{typ: SubmitQueryType, body: SubmitQueryRequest{Query: Query{}}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				if q, _ := h.state().Query(nil, "q2"); q != nil {
					t.Fatalf("rejected query stored: %+v", q)
				}
			},
		},
		{
			name: "stop query, then resubmit replaces it",
			steps: []step{
				submitQ1,
				{typ: StopQueryType, body: StopQueryRequest{Name: "q1"}},
				{typ: StopQueryType, body: StopQueryRequest{Name: "q1"}},
				{typ: StopQueryType, body: StopQueryRequest{Name: "nope"}, wantErr: ErrQueryNotFound},
			},
			check: func(t *testing.T, h *harness) {
				q, _ := h.state().Query(nil, "q1")
				if q == nil || q.Status != QueryStatusStopped {
					t.Fatalf("query = %+v", q)
				}
				if tasks, _ := h.state().TasksByQuery(nil, "q1"); len(tasks) != 0 {
					t.Fatalf("tasks left: %+v", tasks)
				}
				h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q1"}, Tasks: []Task{task("q1", "g", 0, 0, "c")}})
				q, _ = h.state().Query(nil, "q1")
				if q.Status != QueryStatusRunning || q.CreateIndex != h.index {
					t.Fatalf("resubmitted query = %+v", q)
				}
			},
		},
		{
			name: "place tasks",
			steps: []step{
				submitQ1,
				{typ: UpdateTaskStatesType, body: UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: "q1/f0/p0/r0", State: "running"}}}},
				{typ: PlaceTasksType, body: PlaceTasksRequest{Placements: []Placement{
					{TaskID: "q1/f0/p0/r0", WorkerID: "c"},
					{TaskID: "q1/f1/p0/r0", WorkerID: "d"},
					{TaskID: "q1/f0/p0/r1", WorkerID: "nobody"},
					{TaskID: "missing", WorkerID: "a"},
				}}},
			},
			check: func(t *testing.T, h *harness) {
				moved, _ := h.state().Task(nil, "q1/f0/p0/r0")
				if moved.WorkerID != "c" || moved.State != TaskStatePending {
					t.Fatalf("moved task = %+v", moved)
				}
				kept, _ := h.state().Task(nil, "q1/f0/p0/r1")
				if kept.WorkerID != "b" {
					t.Fatalf("task placed on unknown worker: %+v", kept)
				}
				res := h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/f1/p0/r0", WorkerID: ""}}})
				if r := res.Value.(*PlaceTasksResult); r.Moved != 1 {
					t.Fatalf("unplace result = %+v", r)
				}
			},
		},
		{
			name: "update task states in one batch",
			steps: []step{
				submitQ1,
				// A report refused on its own (unknown worker) leaves the
				// others of its batch applied.
				{typ: UpdateTaskStatesBatchType, body: UpdateTaskStatesBatchRequest{Reports: []UpdateTaskStatesRequest{
					{WorkerID: "a", States: []TaskStateUpdate{{TaskID: "q1/f0/p0/r0", State: "running", Message: "ok"}}},
					{WorkerID: "zz", States: []TaskStateUpdate{{TaskID: "q1/f0/p0/r0", State: "failed"}}},
					{WorkerID: "b", States: []TaskStateUpdate{{TaskID: "q1/f0/p0/r1", State: "running"}}},
				}}},
				{typ: UpdateTaskStatesBatchType, body: UpdateTaskStatesBatchRequest{}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				a, _ := h.state().Task(nil, "q1/f0/p0/r0")
				b, _ := h.state().Task(nil, "q1/f0/p0/r1")
				if a.State != "running" || a.Message != "ok" || b.State != "running" {
					t.Fatalf("after the batch: r0 = %+v, r1 = %+v", a, b)
				}
			},
		},
		{
			name: "update task states",
			steps: []step{
				submitQ1,
				{typ: UpdateTaskStatesType, body: UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{
					{TaskID: "q1/f0/p0/r0", State: "running", Message: "ok"},
					{TaskID: "q1/f0/p0/r1", State: "failed"}, // on b: stale report
				}}},
				{typ: UpdateTaskStatesType, body: UpdateTaskStatesRequest{WorkerID: "zz"}, wantErr: ErrWorkerNotFound},
				{typ: UpdateTaskStatesType, body: UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: "q1/f0/p0/r0"}}}, wantErr: ErrInvalidRequest},
				// Only the DCAA state changes: recorded too.
				{typ: UpdateTaskStatesType, body: UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{
					{TaskID: "q1/f0/p0/r0", State: "running", Message: "ok", ReplicaState: "REPLICA_UP_FAILURE", Tentative: true},
				}}},
			},
			check: func(t *testing.T, h *harness) {
				a, _ := h.state().Task(nil, "q1/f0/p0/r0")
				b, _ := h.state().Task(nil, "q1/f0/p0/r1")
				if a.State != "running" || a.Message != "ok" || b.State != TaskStatePending {
					t.Fatalf("tasks = %+v, %+v", a, b)
				}
				if a.ReplicaState != "REPLICA_UP_FAILURE" || !a.Tentative {
					t.Fatalf("DCAA state not recorded: %+v", a)
				}
				if w := h.worker("a"); w.AssignIndex != 5 {
					t.Fatalf("state report changed AssignIndex: %+v", w)
				}
			},
		},
		{
			name: "create and revoke tokens",
			steps: []step{
				{typ: CreateTokenType, body: CreateTokenRequest{Token: newToken("t1", "s3cret", RoleAdmin, 0)}},
				{typ: CreateTokenType, body: CreateTokenRequest{Token: newToken("t2", "other", RoleReader, 1)}},
				{typ: CreateTokenType, body: CreateTokenRequest{Token: Token{ID: "t3", SecretHash: "s3cret", Role: RoleAdmin, CreatedUnixMs: 1}}, wantErr: ErrInvalidRequest},
				{typ: CreateTokenType, body: CreateTokenRequest{Token: newToken("t3", "x", "root", 0)}, wantErr: ErrInvalidRequest},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "t2"}},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "t2"}, wantErr: ErrTokenNotFound},
			},
			check: func(t *testing.T, h *harness) {
				tok, _ := h.state().TokenByHash(hash)
				if tok == nil || tok.ID != "t1" || tok.Role != RoleAdmin || tok.CreateIndex != 5 || tok.ModifyIndex != 5 {
					t.Fatalf("token = %+v", tok)
				}
				if tok, _ := h.state().TokenByHash(HashSecret("other")); tok != nil {
					t.Fatalf("revoked token found: %+v", tok)
				}
			},
		},
		{
			name: "delete worker unplaces its tasks",
			steps: []step{
				submitQ1,
				{typ: DeleteWorkerType, body: DeleteWorkerRequest{WorkerID: "a"}},
				{typ: DeleteWorkerType, body: DeleteWorkerRequest{WorkerID: "a"}, wantErr: ErrWorkerNotFound},
			},
			check: func(t *testing.T, h *harness) {
				if w, _ := h.state().Worker(nil, "a"); w != nil {
					t.Fatalf("deleted worker still there: %+v", w)
				}
				tk, _ := h.state().Task(nil, "q1/f0/p0/r0")
				if tk.WorkerID != "" || tk.State != TaskStatePending {
					t.Fatalf("task of deleted worker = %+v", tk)
				}
				if b := h.worker("b"); b.AssignIndex != 6 {
					t.Fatalf("peer b not bumped: %+v", b)
				}
			},
		},
		{
			name: "operator versions, contracts, ledger, health actions",
			steps: []step{
				{typ: UpsertOperatorVersionType, body: UpsertOperatorVersionRequest{Version: OperatorVersion{Operator: "filter", Version: "v1", SpecJSON: []byte(`{}`)}}},
				{typ: UpsertOperatorVersionType, body: UpsertOperatorVersionRequest{Version: OperatorVersion{Operator: "filter", Version: "v2"}}},
				{typ: UpsertOperatorVersionType, body: UpsertOperatorVersionRequest{Version: OperatorVersion{Operator: "filter"}}, wantErr: ErrInvalidRequest},
				{typ: UpsertContractType, body: UpsertContractRequest{Contract: Contract{ID: "c1", Partner: "org2", Status: "active", Body: []byte("signed")}}},
				{typ: AppendLedgerEntryType, body: AppendLedgerEntryRequest{Entry: LedgerEntry{Seq: 1, Hash: "h1", Kind: "contract", Body: []byte("x")}}},
				{typ: AppendLedgerEntryType, body: AppendLedgerEntryRequest{Entry: LedgerEntry{Seq: 2, PrevHash: "h1", Hash: "h2", Kind: "move"}}},
				{typ: AppendLedgerEntryType, body: AppendLedgerEntryRequest{Entry: LedgerEntry{Seq: 3, PrevHash: "bad", Hash: "h3", Kind: "move"}}, wantErr: ErrLedgerChain},
				{typ: AppendLedgerEntryType, body: AppendLedgerEntryRequest{Entry: LedgerEntry{Seq: 5, PrevHash: "h2", Hash: "h3", Kind: "move"}}, wantErr: ErrLedgerChain},
				{typ: RecordHealthActionType, body: RecordHealthActionRequest{Action: HealthAction{ID: "h1", Query: "q1", Diagnosis: "slow", Action: "move"}}},
				{typ: HealthLogType, body: HealthLogRequest{Action: HealthAction{ID: "h2", Query: "q1", Fragment: "f0", Diagnosis: "slow_instance", Action: "move", AtMs: 1, Outcome: HealthPending}}},
				{typ: HealthLogType, body: HealthLogRequest{Action: HealthAction{ID: "h3", Query: "q1", Outcome: HealthPending}}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				vs, _ := h.state().OperatorVersions(nil, "filter")
				cs, _ := h.state().ContractsByPartner(nil, "org2")
				ls, _ := h.state().LedgerEntries(nil, 2)
				as, _ := h.state().HealthActions(nil, "q1")
				if len(vs) != 2 || len(cs) != 1 || len(ls) != 1 || ls[0].Hash != "h2" || len(as) != 2 {
					t.Fatalf("versions %d contracts %d ledger %+v actions %d", len(vs), len(cs), ls, len(as))
				}
			},
		},
		{
			name: "apply plan",
			steps: []step{
				submitQ1, // index 5: q1 runs definition 5
				{typ: ApplyPlanType, body: ApplyPlanRequest{Source: PlanSourceMove, Placements: []PlannedPlacement{
					{TaskID: "q1/f0/p0/r0", FromWorker: "a", FromGeneration: 1, ToWorker: "c"},
					{TaskID: "q1/f0/p0/r1", FromWorker: "a", FromGeneration: 1, ToWorker: "d"}, // stale: on b
				}, SlotMaps: []SlotMapUpdate{{Query: "q1", Fragment: "f0", QueryIndex: 5, Partitions: 2, Ranges: ContiguousSlotMap(2)}}}},
				{typ: ApplyPlanType, body: ApplyPlanRequest{}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				moved, _ := h.state().Task(nil, "q1/f0/p0/r0")
				kept, _ := h.state().Task(nil, "q1/f0/p0/r1")
				m, _ := h.state().SlotMap(nil, "q1", "f0")
				if moved.WorkerID != "c" || moved.Generation != 2 || kept.WorkerID != "b" || kept.Generation != 1 || m == nil || m.Epoch != 1 {
					t.Fatalf("moved %+v kept %+v slot map %+v", moved, kept, m)
				}
			},
		},
		{
			name: "reconfigure query",
			steps: []step{
				submitQ1,
				{typ: ReconfigureQueryType, body: ReconfigureQueryRequest{Query: "q1", Plan: ReconfigPlan{Epoch: 1,
					Changes: []OperatorChange{{Operator: "f0", Version: 2, SpecJSON: []byte(`{"name":"f0"}`)}}}}},
				{typ: ReconfigureQueryType, body: ReconfigureQueryRequest{Query: "q1", Plan: ReconfigPlan{Epoch: 1,
					Changes: []OperatorChange{{Operator: "f0", Version: 2}}}}, wantErr: ErrInvalidRequest},
			},
			check: func(t *testing.T, h *harness) {
				q, _ := h.state().Query(nil, "q1")
				if q.Reconfig == nil || q.Reconfig.Latest() != 1 || q.Reconfig.Plans[0].Phase != ReconfigLoading {
					t.Fatalf("reconfig = %+v", q.Reconfig)
				}
			},
		},
		{
			name: "hosted tasks",
			steps: []step{
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{Task: HostedTask{ID: HostedTaskID("alpha", "q9/f/p0/r0"), Owner: "alpha", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r0", Generation: 2, WorkerID: "a", Phase: HostedMoving, Since: 7, Load: 0.5, SpecJSON: []byte(`{}`)}}},
				// stale generation, unknown worker, owner = host, bad phase, bad id
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{IfGeneration: 1, Task: HostedTask{ID: HostedTaskID("alpha", "q9/f/p0/r0"), Owner: "alpha", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r0", Generation: 3, Phase: HostedRunning}}, wantErr: ErrHostedStale},
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{Task: HostedTask{ID: HostedTaskID("alpha", "q9/f/p0/r1"), Owner: "alpha", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r1", Generation: 2, WorkerID: "zz", Phase: HostedMoving}}, wantErr: ErrWorkerNotFound},
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{Task: HostedTask{ID: HostedTaskID("beta", "q9/f/p0/r1"), Owner: "beta", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r1", Generation: 2, Phase: HostedMoving}}, wantErr: ErrInvalidRequest},
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{Task: HostedTask{ID: HostedTaskID("alpha", "q9/f/p0/r1"), Owner: "alpha", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r1", Generation: 2, Phase: "flying"}}, wantErr: ErrInvalidRequest},
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{Task: HostedTask{ID: "x", Owner: "alpha", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r1", Generation: 2, Phase: HostedMoving}}, wantErr: ErrInvalidRequest},
				// the move ends: the copy runs on b now
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{IfGeneration: 2, Task: HostedTask{ID: HostedTaskID("alpha", "q9/f/p0/r0"), Owner: "alpha", Host: "beta", Contract: "c1",
					Query: "q9", TaskID: "q9/f/p0/r0", Generation: 2, WorkerID: "b", Phase: HostedRunning, Since: 7, Load: 0.5}}},
				{typ: DeleteHostedTaskType, body: DeleteHostedTaskRequest{ID: HostedTaskID("alpha", "q9/f/p0/r0"), IfGeneration: 1}, wantErr: ErrHostedStale},
				{typ: UpsertHostedTaskType, body: UpsertHostedTaskRequest{Task: HostedTask{ID: HostedTaskID("gamma", "q7/f/p0/r0"), Owner: "gamma", Host: "beta", Contract: "c2",
					Query: "q7", TaskID: "q7/f/p0/r0", Generation: 1, WorkerID: "c", Phase: HostedRunning}}},
				{typ: DeleteHostedTaskType, body: DeleteHostedTaskRequest{ID: HostedTaskID("gamma", "q7/f/p0/r0")}},
				{typ: DeleteHostedTaskType, body: DeleteHostedTaskRequest{ID: "nothing"}},
			},
			check: func(t *testing.T, h *harness) {
				hs, _ := h.state().HostedTasks(nil)
				if len(hs) != 1 || hs[0].WorkerID != "b" || hs[0].Phase != HostedRunning || hs[0].Contract != "c1" || hs[0].Load != 0.5 {
					t.Fatalf("hosted %+v", hs)
				}
				// a lost its hosted copy, b gained it, c gained and lost one:
				// each one's assignments changed.
				if a, b, c := h.worker("a"), h.worker("b"), h.worker("c"); a.AssignIndex <= 4 || b.AssignIndex <= 4 || c.AssignIndex <= 4 {
					t.Fatalf("assign indexes a %d b %d c %d", a.AssignIndex, b.AssignIndex, c.AssignIndex)
				}
			},
		},
		{
			name: "abort move",
			steps: []step{
				submitQ1, // index 5
				{typ: ApplyPlanType, body: ApplyPlanRequest{Source: PlanSourceMove, Placements: []PlannedPlacement{
					{TaskID: "q1/f0/p0/r0", FromWorker: "a", FromGeneration: 1, ToWorker: "c", Live: true, CatchUp: true}}}},
				{typ: AbortMoveType, body: AbortMoveRequest{TaskID: "q1/f0/p0/r0", Generation: 1}, wantErr: ErrNotMoving},
				{typ: AbortMoveType, body: AbortMoveRequest{TaskID: "q1/f0/p0/r1", Generation: 1}, wantErr: ErrNotMoving},
				{typ: AbortMoveType, body: AbortMoveRequest{TaskID: "q1/f0/p0/r0", Generation: 2, Reason: "partner gone"}},
				{typ: AbortMoveType, body: AbortMoveRequest{TaskID: "q1/f0/p0/r0", Generation: 2}, wantErr: ErrNotMoving},
			},
			check: func(t *testing.T, h *harness) {
				tk, _ := h.state().Task(nil, "q1/f0/p0/r0")
				if tk.WorkerID != "a" || tk.Gen() != 1 || tk.MovingFrom != "" || tk.MoveCatchUp {
					t.Fatalf("aborted move left %+v", tk)
				}
				if c := h.worker("c"); c.AssignIndex != h.index-1 {
					t.Fatalf("c's assignments not bumped by the abort: %+v (index %d)", c, h.index)
				}
			},
		},
	}
	covered := map[MessageType]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for i, id := range []string{"a", "b", "c", "d"} { // indexes 1..4
				h.registerWorker(id, "127.0.0.1:"+string(rune('1'+i)))
			}
			for _, s := range tc.steps {
				covered[s.typ] = true
				before := dump(t, h.state())
				res := h.apply(s.typ, s.body)
				requireErrIs(t, res, s.wantErr)
				if res.Index != h.index || h.state().LatestIndex() != h.index {
					t.Fatalf("%s: result index %d, LatestIndex %d, want %d", s.typ, res.Index, h.state().LatestIndex(), h.index)
				}
				if s.wantErr != nil {
					after := dump(t, h.state())
					delete(before, tableIndexes)
					delete(after, tableIndexes)
					requireSameState(t, before, after)
				}
			}
			tc.check(t, h)
			roundTrip(t, h.fsm)
		})
	}
	for typ := range commandDecoders {
		if !covered[typ] {
			t.Errorf("command type %s has no case in TestCommands", typ)
		}
	}
}

func TestTableIndexes(t *testing.T) {
	h := newHarness(t)
	h.registerWorker("a", "x:1")
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "a")}})
	h.mustApply(CreateTokenType, CreateTokenRequest{Token: newToken("t", "t", RoleWorker, 0)})
	s := h.state()
	for table, want := range map[string]uint64{TableWorkers: 2, TableQueries: 2, TableTasks: 2, TableTokens: 3, TableContracts: 0} {
		if got := s.TableIndex(table); got != want {
			t.Errorf("TableIndex(%s) = %d, want %d", table, got, want)
		}
	}
	if res := h.apply(StopQueryType, StopQueryRequest{Name: "nope"}); res.Err == nil || s.LatestIndex() != 4 || s.TableIndex(TableQueries) != 2 {
		t.Fatalf("rejected command: err %v latest %d queries index %d", res.Err, s.LatestIndex(), s.TableIndex(TableQueries))
	}
}

func TestIdempotency(t *testing.T) {
	h := newHarness(t)
	first := h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "w1", Addr: "x:1"}, IdempotencyKey: "k-reg"})
	// A retry of the same logical request (the caller regenerated the id).
	again := h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "w2", Addr: "x:1"}, IdempotencyKey: "k-reg"})
	if again.Value != "w1" || !again.Deduplicated || again.Index != first.Index || first.Value != "w1" {
		t.Fatalf("first %+v, retry %+v", first, again)
	}
	if ws, _ := h.state().Workers(nil); len(ws) != 1 {
		t.Fatalf("workers = %d, want 1", len(ws))
	}

	sub := SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "w1")}, IdempotencyKey: "k-sub"}
	r1 := h.mustApply(SubmitQueryType, sub)
	r2 := h.mustApply(SubmitQueryType, sub) // without dedup this would be ErrQueryExists
	if !reflect.DeepEqual(r1.Value, r2.Value) || r2.Index != r1.Index || !r2.Deduplicated {
		t.Fatalf("submit results differ: %+v vs %+v", r1, r2)
	}
	if qs, _ := h.state().Queries(nil); len(qs) != 1 || qs[0].CreateIndex != r1.Index {
		t.Fatalf("queries = %+v", qs)
	}

	requireErrIs(t, h.apply(StopQueryType, StopQueryRequest{Name: "q", IdempotencyKey: "k-sub"}), ErrIdempotencyKeyReused)
	if q, _ := h.state().Query(nil, "q"); q.Status != QueryStatusRunning {
		t.Fatal("key reuse by another type applied the command")
	}
	// Rejected commands do not record their key: a later valid retry applies.
	requireErrIs(t, h.apply(StopQueryType, StopQueryRequest{Name: "other", IdempotencyKey: "k-stop"}), ErrQueryNotFound)
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "other"}})
	if res := h.mustApply(StopQueryType, StopQueryRequest{Name: "other", IdempotencyKey: "k-stop"}); res.Deduplicated {
		t.Fatal("rejected command's key was recorded")
	}
	roundTrip(t, h.fsm)
}

func TestIdempotencyPruneKeepsNewest(t *testing.T) {
	h := newHarness(t)
	h.fsm.maxIdempotencyKeys = 3
	for i := 1; i <= 5; i++ {
		id := string(rune('0' + i))
		h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "w" + id}, IdempotencyKey: "k" + id})
	}
	keys := func(s *StateStore) string {
		var out []string
		for _, obj := range dump(t, s)[TableIdempotency] {
			out = append(out, obj.(*IdempotencyRecord).Key)
		}
		return strings.Join(out, ",")
	}
	if got := keys(h.state()); got != "k3,k4,k5" {
		t.Fatalf("keys = %s, want k3,k4,k5", got)
	}
	// The count is rebuilt on restore, so pruning continues identically.
	restored := roundTrip(t, h.fsm)
	restored.maxIdempotencyKeys = 3
	h2 := &harness{t: t, fsm: restored, index: h.index}
	h2.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "w6"}, IdempotencyKey: "k6"})
	if got := keys(restored.State()); got != "k4,k5,k6" {
		t.Fatalf("keys after restore = %s, want k4,k5,k6", got)
	}
	// A pruned key is forgotten: the command applies again.
	if res := h2.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "w1b"}, IdempotencyKey: "k1"}); res.Deduplicated {
		t.Fatal("pruned key still deduplicated")
	}
}

func TestUnknownAndMalformedEntries(t *testing.T) {
	// An ignorable unknown type is skipped and the FSM goes on.
	h := newHarness(t)
	h.registerWorker("a", "x:1")
	res := h.applyRaw(append([]byte{byte(IgnoreUnknownTypeFlag | 0x7f)}, `{"future":true}`...))
	if res.Err != nil || res.Value != nil || h.state().LatestIndex() != h.index || h.fsm.HaltErr() != nil {
		t.Fatalf("ignorable unknown: %+v latest %d halt %v", res, h.state().LatestIndex(), h.fsm.HaltErr())
	}

	// An entry that cannot be applied halts the FSM: it is never skipped.
	valid, err := Encode(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "a", Status: WorkerStatusDown})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		data []byte
		want error
	}{
		"empty entry":           {nil, ErrMalformedCommand},
		"bad json":              {append([]byte{byte(RegisterWorkerType)}, "not json"...), ErrMalformedCommand},
		"truncated":             {valid[:len(valid)-6], ErrMalformedCommand},
		"wrong field type":      {append([]byte{byte(SetWorkerStatusType)}, `{"worker_id":7,"status":"down"}`...), ErrMalformedCommand},
		"trailing data":         {append([]byte{byte(SetWorkerStatusType)}, `{"worker_id":"a","status":"down"} {}`...), ErrMalformedCommand},
		"unknown non-ignorable": {[]byte{0x7f, '{', '}'}, ErrUnknownCommand},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.registerWorker("a", "x:1")
			before := dump(t, h.state())
			res := h.applyRaw(tc.data)
			if !errors.Is(res.Err, ErrHalted) || !errors.Is(res.Err, tc.want) {
				t.Fatalf("err = %v, want ErrHalted wrapping %v", res.Err, tc.want)
			}
			select {
			case <-h.fsm.Halted():
			default:
				t.Fatal("Halted() not closed")
			}
			if !errors.Is(h.fsm.HaltErr(), ErrHalted) {
				t.Fatalf("HaltErr = %v", h.fsm.HaltErr())
			}
			// Nothing after the halt applies, and no snapshot is taken.
			if res := h.applyRaw(valid); !errors.Is(res.Err, ErrHalted) {
				t.Fatalf("entry after halt: %+v, want ErrHalted", res)
			}
			if _, err := h.fsm.Snapshot(); !errors.Is(err, ErrHalted) {
				t.Fatalf("Snapshot after halt: %v, want ErrHalted", err)
			}
			requireSameState(t, before, dump(t, h.state()))
		})
	}
}

// TestUnknownFieldsAppliedIdentically: a newer build adds fields to a
// command (top level and nested); this build applies the entry exactly as
// it applies the entry without them.
func TestUnknownFieldsAppliedIdentically(t *testing.T) {
	plain, future := newHarness(t), newHarness(t)
	entries := []struct {
		typ  MessageType
		body any
	}{
		{RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "w1", Addr: "w1:1", Cores: 2}, IdempotencyKey: "k1"}},
		{SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q", Replicas: 1}, Tasks: []Task{task("q", "f", 0, 0, "w1")}, IdempotencyKey: "k2"}},
		{SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "w1", Status: WorkerStatusDown, At: 5}},
		{StopQueryType, StopQueryRequest{Name: "q"}},
	}
	for _, e := range entries {
		data, err := Encode(e.typ, e.body)
		if err != nil {
			t.Fatal(err)
		}
		// Add a field at the top level and inside every nested object.
		extended := bytes.ReplaceAll(data[1:], []byte("{"), []byte(`{"added_by_a_newer_build":{"x":[1,2]},`))
		extended = bytes.ReplaceAll(extended, []byte(",}"), []byte("}"))
		if !json.Valid(extended) || bytes.Equal(extended, data[1:]) {
			t.Fatalf("bad test entry %s", extended)
		}
		r1 := plain.applyRaw(data)
		r2 := future.applyRaw(append([]byte{data[0]}, extended...))
		if r1.Err != nil || r2.Err != nil || !reflect.DeepEqual(r1, r2) {
			t.Fatalf("%s: plain %+v, with unknown fields %+v", e.typ, r1, r2)
		}
	}
	requireSameState(t, dump(t, plain.state()), dump(t, future.state()))
	if future.fsm.HaltErr() != nil {
		t.Fatalf("halted: %v", future.fsm.HaltErr())
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestEncodeRoundTrip(t *testing.T) {
	data, err := Encode(StopQueryType, StopQueryRequest{Name: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if MessageType(data[0]) != StopQueryType || !strings.Contains(string(data[1:]), `"name":"q"`) {
		t.Fatalf("Encode = %q", data)
	}
	if _, err := Encode(StopQueryType, func() {}); err == nil {
		t.Fatal("Encode of a func succeeded")
	}
	if got := (IgnoreUnknownTypeFlag | 3).String(); got != "Unknown(0x83)" {
		t.Fatalf("String = %q", got)
	}
}
