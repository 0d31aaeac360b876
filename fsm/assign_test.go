package fsm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-memdb"
)

// assignFixture: workers a, b, c, d; query q1 with tasks on a and b.
func assignFixture(t *testing.T) *harness {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		h.registerWorker(id, id+":7000")
	}
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q1"}, Tasks: []Task{
		task("q1", "f", 0, 0, "a"), task("q1", "f", 0, 1, "b"), task("q1", "g", 0, 0, ""),
	}})
	return h
}

func assignIndexes(h *harness) map[string]uint64 {
	out := map[string]uint64{}
	for _, id := range []string{"a", "b", "c", "d"} {
		if w, _ := h.state().Worker(nil, id); w != nil {
			out[id] = w.AssignIndex
		}
	}
	return out
}

func TestAssignIndex(t *testing.T) {
	const submitted = 5 // fixture: 4 registrations, then the submit
	cases := []struct {
		name   string
		change func(h *harness)
		// want: worker -> expected AssignIndex; "now" means the change's index.
		bumped    []string
		notBumped map[string]uint64
	}{
		{
			name:      "submit bumps the query's workers only",
			change:    func(h *harness) {},
			bumped:    []string{"a", "b"},
			notBumped: map[string]uint64{"c": 3, "d": 4},
		},
		{
			name: "moving a task bumps old, new and peer workers",
			change: func(h *harness) {
				h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/f/p0/r0", WorkerID: "c"}}})
			},
			bumped:    []string{"a", "b", "c"},
			notBumped: map[string]uint64{"d": 4},
		},
		{
			name: "placing an unplaced task bumps the query's workers",
			change: func(h *harness) {
				h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/g/p0/r0", WorkerID: "d"}}})
			},
			bumped:    []string{"a", "b", "d"},
			notBumped: map[string]uint64{"c": 3},
		},
		{
			name: "placement to the same worker changes nothing",
			change: func(h *harness) {
				h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/f/p0/r0", WorkerID: "a"}}})
			},
			notBumped: map[string]uint64{"a": submitted, "b": submitted, "c": 3, "d": 4},
		},
		{
			name: "stopping the query bumps its workers",
			change: func(h *harness) {
				h.mustApply(StopQueryType, StopQueryRequest{Name: "q1"})
			},
			bumped:    []string{"a", "b"},
			notBumped: map[string]uint64{"c": 3, "d": 4},
		},
		{
			name: "a peer's address change bumps the query's workers",
			change: func(h *harness) {
				h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "b", Addr: "b:7001"}})
			},
			bumped:    []string{"a", "b"},
			notBumped: map[string]uint64{"c": 3, "d": 4},
		},
		{
			name: "re-registering with the same address bumps nobody",
			change: func(h *harness) {
				h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "b", Addr: "b:7000", Cores: 16}})
			},
			notBumped: map[string]uint64{"a": submitted, "b": submitted, "c": 3, "d": 4},
		},
		{
			name: "deleting a worker bumps its peers",
			change: func(h *harness) {
				h.mustApply(DeleteWorkerType, DeleteWorkerRequest{WorkerID: "a"})
			},
			bumped:    []string{"b"},
			notBumped: map[string]uint64{"c": 3, "d": 4},
		},
		{
			name: "status and task state changes bump nobody",
			change: func(h *harness) {
				h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "b", Status: WorkerStatusDown})
				h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: "q1/f/p0/r0", State: "running"}}})
			},
			notBumped: map[string]uint64{"a": submitted, "b": submitted, "c": 3, "d": 4},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := assignFixture(t)
			tc.change(h)
			got := assignIndexes(h)
			for _, id := range tc.bumped {
				if got[id] != h.index {
					t.Errorf("worker %s AssignIndex = %d, want %d (bumped)", id, got[id], h.index)
				}
				if w := h.worker(id); w.ModifyIndex != h.index {
					t.Errorf("worker %s ModifyIndex = %d, want %d", id, w.ModifyIndex, h.index)
				}
			}
			for id, want := range tc.notBumped {
				if got[id] != want {
					t.Errorf("worker %s AssignIndex = %d, want %d (not bumped)", id, got[id], want)
				}
			}
		})
	}
}

func TestWorkerAssignments(t *testing.T) {
	h := assignFixture(t)
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q0"}, Tasks: []Task{task("q0", "x", 0, 0, "a"), task("q0", "x", 1, 0, "c")}})
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q9"}, Tasks: []Task{task("q9", "x", 0, 0, "d")}})

	index, tasks, views, err := h.state().WorkerAssignments(nil, "a")
	if err != nil {
		t.Fatal(err)
	}
	if index != 6 || len(tasks) != 2 || tasks[0].ID != "q0/x/p0/r0" || tasks[1].ID != "q1/f/p0/r0" {
		t.Fatalf("index %d tasks %+v", index, tasks)
	}
	if len(views) != 2 || views[0].Query.Name != "q0" || views[1].Query.Name != "q1" {
		t.Fatalf("views = %+v", views)
	}
	if got := views[0].WorkerAddrs; len(got) != 2 || got["a"] != "a:7000" || got["c"] != "c:7000" {
		t.Fatalf("q0 addrs = %v", got)
	}
	if v := views[1]; len(v.Tasks) != 3 || len(v.WorkerAddrs) != 2 || v.WorkerAddrs["b"] != "b:7000" {
		t.Fatalf("q1 view = %+v", v)
	}
	if _, _, _, err := h.state().WorkerAssignments(nil, "nobody"); !errors.Is(err, ErrWorkerNotFound) {
		t.Fatalf("unknown worker: err = %v", err)
	}

	// The watch set fires when a's view changes (here: a peer's address).
	ws := memdb.NewWatchSet()
	if _, _, _, err := h.state().WorkerAssignments(ws, "a"); err != nil {
		t.Fatal(err)
	}
	h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "c", Addr: "c:9999"}})
	if timedOut := ws.Watch(time.After(5 * time.Second)); timedOut {
		t.Fatal("watch set did not fire on a view change")
	}
	index, _, views, _ = h.state().WorkerAssignments(nil, "a")
	if index != h.index || views[0].WorkerAddrs["c"] != "c:9999" {
		t.Fatalf("after addr change: index %d addrs %v", index, views[0].WorkerAddrs)
	}
}

type blockResult struct {
	index uint64
	err   error
}

func TestBlockingQuery(t *testing.T) {
	h := assignFixture(t)
	s := h.state()
	assignIndexOf := func(id string) func(memdb.WatchSet) (uint64, error) {
		return func(ws memdb.WatchSet) (uint64, error) {
			index, _, _, err := s.WorkerAssignments(ws, id)
			return index, err
		}
	}

	t.Run("returns at once when the index is past minIndex or minIndex is 0", func(t *testing.T) {
		for _, min := range []uint64{0, 4} {
			index, err := s.BlockingQuery(context.Background(), min, time.Hour, assignIndexOf("a"))
			if err != nil || index != 5 {
				t.Fatalf("min %d: index %d err %v", min, index, err)
			}
		}
	})

	t.Run("wakes when the index moves", func(t *testing.T) {
		done := make(chan blockResult, 1)
		go func() {
			index, err := s.BlockingQuery(context.Background(), 5, time.Minute, assignIndexOf("a"))
			done <- blockResult{index, err}
		}()
		// An unrelated write wakes nothing for a (its record is unchanged);
		// a's view change does.
		h.mustApply(CreateTokenType, CreateTokenRequest{Token: newToken("t", "t", RoleAdmin, 0)})
		h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/g/p0/r0", WorkerID: "c"}}})
		select {
		case r := <-done:
			if r.err != nil || r.index != h.index {
				t.Fatalf("BlockingQuery = %d, %v; want %d", r.index, r.err, h.index)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("BlockingQuery did not wake")
		}
	})

	t.Run("returns the last index at maxWait", func(t *testing.T) {
		start := time.Now()
		index, err := s.BlockingQuery(context.Background(), 100, 50*time.Millisecond, assignIndexOf("d"))
		if err != nil || index != 4 {
			t.Fatalf("index %d err %v", index, err)
		}
		if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
			t.Fatalf("returned after %v, before maxWait", elapsed)
		}
	})

	t.Run("returns ctx error when cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan blockResult, 1)
		go func() {
			index, err := s.BlockingQuery(ctx, 100, time.Hour, assignIndexOf("d"))
			done <- blockResult{index, err}
		}()
		cancel()
		select {
		case r := <-done:
			if !errors.Is(r.err, context.Canceled) || r.index != 4 {
				t.Fatalf("BlockingQuery = %d, %v", r.index, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("BlockingQuery ignored cancellation")
		}
	})

	t.Run("fn errors are returned", func(t *testing.T) {
		_, err := s.BlockingQuery(context.Background(), 1, time.Hour, assignIndexOf("nobody"))
		if !errors.Is(err, ErrWorkerNotFound) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("restore wakes watchers, which read the new state", func(t *testing.T) {
		// Build a state where d's AssignIndex is higher, and snapshot it.
		other := assignFixture(t)
		other.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/g/p0/r0", WorkerID: "d"}}})
		snap := snapshotBytes(t, other.fsm)

		// Deterministic part: a watch set filled by a read fires on Restore.
		ws := memdb.NewWatchSet()
		if _, err := s.Worker(ws, "d"); err != nil {
			t.Fatal(err)
		}
		if err := restoreBytes(h.fsm, snapshotBytes(t, h.fsm)); err != nil {
			t.Fatal(err)
		}
		if timedOut := ws.Watch(time.After(5 * time.Second)); timedOut {
			t.Fatal("Restore did not fire the watch set of the old state")
		}

		done := make(chan blockResult, 1)
		go func() {
			index, err := s.BlockingQuery(context.Background(), 4, time.Minute, assignIndexOf("d"))
			done <- blockResult{index, err}
		}()
		if err := restoreBytes(h.fsm, snap); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if r.err != nil || r.index != other.index {
				t.Fatalf("BlockingQuery = %d, %v; want %d", r.index, r.err, other.index)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("BlockingQuery not woken by Restore")
		}
	})
}

// TestConcurrentReads runs readers against the store while commands, snapshots
// and restores are applied; run with -race.
func TestConcurrentReads(t *testing.T) {
	h := assignFixture(t)
	s := h.state()
	ctx, cancel := context.WithCancel(context.Background())
	readerDone := make(chan error, 1)
	go func() {
		var last uint64
		for ctx.Err() == nil {
			index, err := s.BlockingQuery(ctx, last, time.Second, func(ws memdb.WatchSet) (uint64, error) {
				index, tasks, views, err := s.WorkerAssignments(ws, "a")
				for _, v := range views {
					_ = len(v.Tasks) + len(tasks)
				}
				return index, err
			})
			if err != nil && ctx.Err() == nil {
				readerDone <- err
				return
			}
			last = index
		}
		readerDone <- nil
	}()
	for i := 0; i < 50; i++ {
		target := "c"
		if i%2 == 0 {
			target = "d"
		}
		h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q1/g/p0/r0", WorkerID: target}}})
		if i%10 == 0 {
			if err := restoreBytes(h.fsm, snapshotBytes(t, h.fsm)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cancel()
	if err := <-readerDone; err != nil {
		t.Fatalf("reader: %v", err)
	}
}
