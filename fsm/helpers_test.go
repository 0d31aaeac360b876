package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"testing"

	"github.com/hashicorp/raft"
)

// harness applies commands to an FSM at increasing log indexes.
type harness struct {
	t     testing.TB
	fsm   *FSM
	index uint64
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	f, err := New(nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &harness{t: t, fsm: f}
}

func (h *harness) state() *StateStore { return h.fsm.State() }

func (h *harness) applyRaw(data []byte) *ApplyResult {
	h.t.Helper()
	h.index++
	res, ok := h.fsm.Apply(&raft.Log{Index: h.index, Term: 1, Type: raft.LogCommand, Data: data}).(*ApplyResult)
	if !ok {
		h.t.Fatalf("Apply at %d did not return *ApplyResult", h.index)
	}
	return res
}

func (h *harness) apply(typ MessageType, body any) *ApplyResult {
	h.t.Helper()
	data, err := Encode(typ, body)
	if err != nil {
		h.t.Fatalf("Encode %s: %v", typ, err)
	}
	return h.applyRaw(data)
}

func (h *harness) mustApply(typ MessageType, body any) *ApplyResult {
	h.t.Helper()
	res := h.apply(typ, body)
	if res.Err != nil {
		h.t.Fatalf("apply %s at %d: %v", typ, h.index, res.Err)
	}
	return res
}

func (h *harness) registerWorker(id, addr string) {
	h.t.Helper()
	h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Name: "name-" + id, Org: "org1", Addr: addr, Cores: 4}})
}

func (h *harness) worker(id string) *Worker {
	h.t.Helper()
	w, err := h.state().Worker(nil, id)
	if err != nil || w == nil {
		h.t.Fatalf("Worker(%q) = %v, %v", id, w, err)
	}
	return w
}

// task builds a task of query q placed on worker.
func task(q, fragment string, partition, replica int, worker string) Task {
	return Task{ID: TaskID(q, fragment, partition, replica), Query: q, Fragment: fragment, Partition: partition, Replica: replica, WorkerID: worker}
}

// dump reads every table of the store in id order.
func dump(t testing.TB, s *StateStore) map[string][]any {
	t.Helper()
	txn := s.gen.Load().db.Txn(false)
	out := map[string][]any{}
	for table := range stateSchema().Tables {
		it, err := txn.Get(table, indexID)
		if err != nil {
			t.Fatalf("dump %s: %v", table, err)
		}
		for obj := it.Next(); obj != nil; obj = it.Next() {
			out[table] = append(out[table], obj)
		}
	}
	return out
}

func requireSameState(t testing.TB, want, got map[string][]any) {
	t.Helper()
	if reflect.DeepEqual(want, got) {
		return
	}
	tables := map[string]bool{}
	for k := range want {
		tables[k] = true
	}
	for k := range got {
		tables[k] = true
	}
	names := make([]string, 0, len(tables))
	for k := range tables {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, table := range names {
		if !reflect.DeepEqual(want[table], got[table]) {
			w, _ := json.Marshal(want[table])
			g, _ := json.Marshal(got[table])
			t.Errorf("table %s differs:\nwant %s\n got %s", table, w, g)
		}
	}
	t.FailNow()
}

// memSink is an in-memory raft.SnapshotSink.
type memSink struct {
	bytes.Buffer
	cancelled, closed bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func snapshotBytes(t testing.TB, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer snap.Release()
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("Persist left sink closed=%v cancelled=%v", sink.closed, sink.cancelled)
	}
	return sink.Bytes()
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func restoreBytes(f *FSM, data []byte) error {
	return f.Restore(readCloser{bytes.NewReader(data)})
}

// roundTrip snapshots f, restores into a new FSM and checks every table is
// unchanged.
func roundTrip(t testing.TB, f *FSM) *FSM {
	t.Helper()
	data := snapshotBytes(t, f)
	restored, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := restoreBytes(restored, data); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	requireSameState(t, dump(t, f.State()), dump(t, restored.State()))
	if got, want := restored.State().LatestIndex(), f.State().LatestIndex(); got != want {
		t.Fatalf("LatestIndex after restore = %d, want %d", got, want)
	}
	return restored
}

func requireErrIs(t testing.TB, res *ApplyResult, want error) {
	t.Helper()
	if want == nil {
		if res.Err != nil {
			t.Fatalf("unexpected error: %v", res.Err)
		}
		return
	}
	if !errors.Is(res.Err, want) {
		t.Fatalf("error = %v, want %v", res.Err, want)
	}
}
