package fsm

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

type raftNode struct {
	raft      *raft.Raft
	fsm       *FSM
	snapshots *raft.InmemSnapshotStore
}

// startNode starts a single-voter raft node with in-memory stores. If the
// snapshot store already holds a snapshot, raft restores the FSM from it.
func startNode(t *testing.T, id raft.ServerID, addr raft.ServerAddress, snapshots *raft.InmemSnapshotStore, bootstrap bool) *raftNode {
	t.Helper()
	conf := raft.DefaultConfig()
	conf.LocalID = id
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = hclog.NewNullLogger()
	f, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	store := raft.NewInmemStore()
	_, trans := raft.NewInmemTransport(addr)
	if bootstrap {
		cfg := raft.Configuration{Servers: []raft.Server{{ID: id, Address: trans.LocalAddr()}}}
		if err := raft.BootstrapCluster(conf, store, store, snapshots, trans, cfg); err != nil {
			t.Fatalf("BootstrapCluster: %v", err)
		}
	}
	r, err := raft.NewRaft(conf, f, store, store, snapshots, trans)
	if err != nil {
		t.Fatalf("NewRaft: %v", err)
	}
	t.Cleanup(func() { _ = r.Shutdown().Error() })
	deadline := time.Now().Add(10 * time.Second)
	for r.State() != raft.Leader {
		if time.Now().After(deadline) {
			t.Fatalf("node %s did not become leader (state %s)", id, r.State())
		}
		select {
		case <-r.LeaderCh():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return &raftNode{raft: r, fsm: f, snapshots: snapshots}
}

func (n *raftNode) apply(t *testing.T, typ MessageType, body any) *ApplyResult {
	t.Helper()
	data, err := Encode(typ, body)
	if err != nil {
		t.Fatal(err)
	}
	future := n.raft.Apply(data, 5*time.Second)
	if err := future.Error(); err != nil {
		t.Fatalf("raft Apply %s: %v", typ, err)
	}
	res, ok := future.Response().(*ApplyResult)
	if !ok {
		t.Fatalf("Response is %T, want *ApplyResult", future.Response())
	}
	if res.Index != future.Index() && !res.Deduplicated {
		t.Fatalf("result index %d, log index %d", res.Index, future.Index())
	}
	return res
}

func TestRaftApplySnapshotRestore(t *testing.T) {
	n1 := startNode(t, "node1", "node1-addr", raft.NewInmemSnapshotStore(), true)

	for _, id := range []string{"a", "b"} {
		if res := n1.apply(t, RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Addr: id + ":1"}, IdempotencyKey: "reg-" + id}); res.Err != nil || res.Value != id {
			t.Fatalf("register %s: %+v", id, res)
		}
	}
	submit := SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "a"), task("q", "f", 0, 1, "b")}, IdempotencyKey: "sub-q"}
	first := n1.apply(t, SubmitQueryType, submit)
	if again := n1.apply(t, SubmitQueryType, submit); again.Err != nil || !again.Deduplicated || again.Index != first.Index {
		t.Fatalf("retried submit through raft: %+v (first %+v)", again, first)
	}
	if res := n1.apply(t, StopQueryType, StopQueryRequest{Name: "missing"}); !errors.Is(res.Err, ErrQueryNotFound) {
		t.Fatalf("stop missing: %+v", res)
	}
	n1.apply(t, CreateTokenType, CreateTokenRequest{Token: newToken("t1", "secret", RoleAdmin, 0)})
	n1.apply(t, UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: "q/f/p0/r0", State: "running"}}})

	snap := n1.raft.Snapshot()
	if err := snap.Error(); err != nil {
		t.Fatalf("raft Snapshot: %v", err)
	}
	meta, rc, err := snap.Open()
	if err != nil {
		t.Fatalf("open snapshot: %v", err)
	}
	data, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := dump(t, n1.fsm.State())
	if meta.Index != n1.fsm.State().LatestIndex() {
		t.Fatalf("snapshot index %d, FSM latest index %d", meta.Index, n1.fsm.State().LatestIndex())
	}
	if err := n1.raft.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}

	// A fresh node whose snapshot store holds that snapshot restores it on start.
	store2 := raft.NewInmemSnapshotStore()
	_, peerEncoder := raft.NewInmemTransport("node1-addr") // Create encodes peers with it
	sink, err := store2.Create(raft.SnapshotVersionMax, meta.Index, meta.Term, meta.Configuration, meta.ConfigurationIndex, peerEncoder)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	n2 := startNode(t, "node1", "node1-addr", store2, false)
	requireSameState(t, want, dump(t, n2.fsm.State()))

	// The restored node keeps applying, and remembers idempotency keys.
	if res := n2.apply(t, SubmitQueryType, submit); !res.Deduplicated || res.Index != first.Index {
		t.Fatalf("submit retry after restore: %+v", res)
	}
	res := n2.apply(t, PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q/f/p0/r0", WorkerID: "b"}}})
	if res.Err != nil || res.Value.(*PlaceTasksResult).Moved != 1 {
		t.Fatalf("place after restore: %+v", res)
	}
	if a, _ := n2.fsm.State().Worker(nil, "a"); a.AssignIndex != res.Index {
		t.Fatalf("worker a AssignIndex %d, want %d", a.AssignIndex, res.Index)
	}
}
