package dataplane

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The batch codec carries the DCAA stream state (issue 10) both ways and
// stays wire compatible with the standard protobuf encoding.
func TestBatchCodecCarriesReplicaState(t *testing.T) {
	c := newBatchCodec()
	for _, in := range []*fedstreampb.Batch{
		{Data: []byte{1, 2, 3}, Count: 1, LastId: 9, ReplicaState: fedstreampb.ReplicaState_REPLICA_UP_FAILURE, TentativeWatermark: 1_700_000_000_000_000_000},
		{Data: []byte{4}, Count: 1, LastId: 2, ReplicaState: fedstreampb.ReplicaState_REPLICA_STABILIZATION, TentativeWatermark: -5},
		// A diverged stream's lineage (OutputBuffer.Diverge), heartbeat too.
		{Data: []byte{4}, Count: 1, LastId: 12, PositionOffset: 3, Lineage: 0xfedcba9876543211, LineageSince: 7},
		{LastId: 12, Lineage: 5, LineageSince: 0},
		// The ranges of the stream's records (NoteUncorrectable),
		// whole-range and negative bounds included.
		{Data: []byte{4}, Count: 1, LastId: 12, Lineage: 5, NamedRanges: []int64{math.MinInt64, 7_990_000_001, -3, math.MaxInt64}},
		{Data: []byte{4}, Count: 1, LastId: 2}, // no DCAA: nothing extra on the wire
	} {
		bs, err := c.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		wire := bs.Materialize()
		// The custom decoder and the standard one read the same.
		var got fedstreampb.Batch
		if err := unmarshalBatch(append([]byte(nil), wire...), &got); err != nil {
			t.Fatal(err)
		}
		var std fedstreampb.Batch
		if err := proto.Unmarshal(wire, &std); err != nil {
			t.Fatal(err)
		}
		for _, b := range []*fedstreampb.Batch{&got, &std} {
			if !proto.Equal(b, in) {
				t.Fatalf("decoded %v, sent %v", b, in)
			}
		}
		// And the custom decoder reads what the standard encoder writes.
		stdWire, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var back fedstreampb.Batch
		if err := unmarshalBatch(stdWire, &back); err != nil || !proto.Equal(&back, in) {
			t.Fatalf("standard encoding decoded as %v (%v), sent %v", &back, err, in)
		}
	}
}
