package dataplane

import (
	"context"
	"testing"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// olderBuildTypes is the highest tuple type a build before data-plane
// levels (and before UNCORRECTABLE) decodes: it refuses anything above as
// tuple.ErrBadType, which ends the subscription.
const olderBuildTypes = tuple.RecDone

// TestOlderSubscriberNeverGetsUncorrectable plays a rolling upgrade: a
// subscriber stating no data-plane level (an older build) reads a stream
// holding an UNCORRECTABLE record. It must get a REC_DONE in its place, at
// the same position and with the same position offset, while a subscriber
// of this build gets the record itself.
func TestOlderSubscriberNeverGetsUncorrectable(t *testing.T) {
	ctx := context.Background()
	buf := NewOutputBuffer(BufferOptions{})
	stream := []*tuple.Tuple{
		dataTuple(1, "a"),
		{Type: tuple.Undo, ID: 2, STime: 1},
		func() *tuple.Tuple { mk := tuple.UncorrectableMarker(5, 40); mk.ID = 3; return &mk }(),
		dataTuple(4, "b"),
		{Type: tuple.RecDone, ID: 5, STime: 4},
		dataTuple(6, "c"),
	}
	for _, tp := range stream {
		if err := buf.Append(ctx, tp); err != nil {
			t.Fatal(err)
		}
	}
	buf.MarkNonStable(2, 3)
	buf.MarkNonStable(5, 5)
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": buf}})
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}

	read := func(level int32) (types []tuple.Type, ids []uint64, offset uint64, sub *Subscriber) {
		ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
		sub = NewSubscriber(ref, "down-0", true, 0)
		sub.StateLevel(level)
		err := sub.Run(ctx, conn, func(ctx context.Context, b *Batch) error {
			for _, tp := range b.Tuples {
				types, ids = append(types, tp.Type), append(ids, tp.ID)
			}
			offset = b.Offset
			if b.LastID >= 6 {
				return ErrStopSubscription
			}
			return nil
		})
		if err != nil {
			t.Fatalf("level %d: %v", level, err)
		}
		return types, ids, offset, sub
	}

	oldTypes, oldIDs, oldOff, oldSub := read(0)
	newTypes, newIDs, newOff, newSub := read(rpc.DataPlaneLevel)

	wantOld := []tuple.Type{tuple.Stable, tuple.Undo, tuple.RecDone, tuple.Stable, tuple.RecDone, tuple.Stable}
	wantNew := []tuple.Type{tuple.Stable, tuple.Undo, tuple.Uncorrectable, tuple.Stable, tuple.RecDone, tuple.Stable}
	for i, typ := range oldTypes {
		if typ > olderBuildTypes {
			t.Fatalf("an older subscriber got tuple type %v at id %d, which it cannot decode", typ, oldIDs[i])
		}
	}
	if len(oldTypes) != len(wantOld) || len(newTypes) != len(wantNew) {
		t.Fatalf("older subscriber got %v, newer %v", oldTypes, newTypes)
	}
	for i := range wantOld {
		if oldTypes[i] != wantOld[i] || newTypes[i] != wantNew[i] || oldIDs[i] != uint64(i+1) || newIDs[i] != uint64(i+1) {
			t.Fatalf("older subscriber got %v (ids %v), newer %v (ids %v); want %v and %v", oldTypes, oldIDs, newTypes, newIDs, wantOld, wantNew)
		}
	}
	if oldOff != 3 || newOff != 3 {
		t.Fatalf("position offsets %d (older) and %d (newer), want 3: stable ids must not change", oldOff, newOff)
	}
	// The server stated its level in the handshake to both.
	if oldSub.UpstreamLevel() != rpc.DataPlaneLevel || newSub.UpstreamLevel() != rpc.DataPlaneLevel {
		t.Fatalf("upstream levels %d and %d, want %d", oldSub.UpstreamLevel(), newSub.UpstreamLevel(), rpc.DataPlaneLevel)
	}
}

// TestDowngradeLeavesOtherBatchesAlone: a batch without UNCORRECTABLE is
// sent as it is (no copy), and a subscriber of a level that knows the type
// gets the record.
func TestDowngradeLeavesOtherBatchesAlone(t *testing.T) {
	var data []byte
	data = tuple.AppendTuple(data, dataTuple(1, "x"))
	data = tuple.AppendTuple(data, &tuple.Tuple{Type: tuple.Boundary, STime: 9})
	out, n, err := downgradeForLevel(data, 0)
	if err != nil || n != 0 || &out[0] != &data[0] {
		t.Fatalf("batch without UNCORRECTABLE: replaced %d, copied %v, err %v", n, &out[0] != &data[0], err)
	}
	mk := tuple.UncorrectableMarker(1, 2)
	data = tuple.AppendTuple(data, &mk)
	if out, n, err = downgradeForLevel(data, rpc.DataPlaneLevelUncorrectable); err != nil || n != 0 || len(out) != len(data) {
		t.Fatalf("level %d: replaced %d, err %v", rpc.DataPlaneLevelUncorrectable, n, err)
	}
	if _, n, err = downgradeForLevel(data, rpc.DataPlaneLevelBase); err != nil || n != 1 {
		t.Fatalf("level %d: replaced %d, err %v", rpc.DataPlaneLevelBase, n, err)
	}
	if _, _, err = downgradeForLevel(data[:len(data)-1], 0); err == nil {
		t.Fatal("a truncated batch passed")
	}
}
