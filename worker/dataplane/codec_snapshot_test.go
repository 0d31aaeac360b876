package dataplane

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// pieces splits wire into buffers of n bytes, as received frames are.
func pieces(wire []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(wire) > 0 {
		k := min(n, len(wire))
		out = append(out, mem.SliceBuffer(wire[:k]))
		wire = wire[k:]
	}
	return out
}

// TestSnapshotChunkCodec: snapshot chunks are sent without a copy of
// their data and in the standard protobuf encoding, and received straight
// into the snapshot's buffer, whether the total comes before the data
// (this codec) or after it (the standard encoder), with the message
// spread over frames; unknown fields are skipped; a chunk beyond the
// announced size, a size beyond the limit and a truncated message are
// refused.
func TestSnapshotChunkCodec(t *testing.T) {
	c := newBatchCodec()
	first := &fedstreampb.SnapshotChunk{Data: []byte("hello, "), TotalBytes: 12}
	bs, err := c.Marshal(first)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || &bs[1].ReadOnlyData()[0] != &first.Data[0] {
		t.Fatal("the chunk's data was copied into the message")
	}
	wire := bs.Materialize()
	var std fedstreampb.SnapshotChunk
	if err := proto.Unmarshal(wire, &std); err != nil || !proto.Equal(&std, first) {
		t.Fatalf("the standard decoder reads %v (%v), sent %v", &std, err, first)
	}
	into := SnapshotChunkInto{MaxBytes: 100}
	if err := c.Unmarshal(pieces(wire, 1), &into); err != nil {
		t.Fatal(err)
	}
	if into.TotalBytes != 12 || string(into.Dst) != "hello, " || cap(into.Dst) != 12 {
		t.Fatalf("first chunk: total %d, data %q (capacity %d)", into.TotalBytes, into.Dst, cap(into.Dst))
	}
	// The next chunk, in the standard encoding, with fields this version
	// does not know.
	next, err := proto.Marshal(&fedstreampb.SnapshotChunk{Data: []byte("world")})
	if err != nil {
		t.Fatal(err)
	}
	next = protowire.AppendTag(next, 9, protowire.BytesType)
	next = protowire.AppendBytes(next, []byte("unknown"))
	next = protowire.AppendTag(next, 10, protowire.VarintType)
	next = protowire.AppendVarint(next, 1<<40)
	next = protowire.AppendTag(next, 11, protowire.Fixed64Type)
	next = protowire.AppendFixed64(next, 7)
	buf := &into.Dst[0]
	if err := c.Unmarshal(pieces(next, 3), &into); err != nil {
		t.Fatal(err)
	}
	if string(into.Dst) != "hello, world" || &into.Dst[0] != buf {
		t.Fatalf("after the second chunk: %q (moved %v)", into.Dst, &into.Dst[0] != buf)
	}
	// Beyond the announced size.
	if err := c.Unmarshal(pieces(next, 64), &into); !errors.Is(err, ErrSnapshotOverflow) {
		t.Fatalf("a chunk beyond the announced size: %v, want ErrSnapshotOverflow", err)
	}

	// The standard encoder writes the data before the total.
	stdWire, err := proto.Marshal(&fedstreampb.SnapshotChunk{Data: []byte("abc"), TotalBytes: 5})
	if err != nil {
		t.Fatal(err)
	}
	if stdWire[0] != byte(protowire.EncodeTag(chunkFieldData, protowire.BytesType)) {
		t.Fatal("the standard encoder wrote the total first: the test proves nothing")
	}
	into = SnapshotChunkInto{MaxBytes: 100}
	if err := c.Unmarshal(pieces(stdWire, 2), &into); err != nil {
		t.Fatal(err)
	}
	if into.TotalBytes != 5 || !bytes.Equal(into.Dst, []byte("abc")) || cap(into.Dst) != 5 {
		t.Fatalf("standard first chunk: total %d, data %q (capacity %d)", into.TotalBytes, into.Dst, cap(into.Dst))
	}

	into = SnapshotChunkInto{MaxBytes: 4}
	if err := c.Unmarshal(pieces(stdWire, 64), &into); !errors.Is(err, ErrSnapshotOverflow) {
		t.Fatalf("a size beyond MaxBytes: %v, want ErrSnapshotOverflow", err)
	}
	into = SnapshotChunkInto{MaxBytes: 100}
	if err := c.Unmarshal(pieces(wire[:len(wire)-2], 64), &into); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a truncated chunk: %v, want ErrProtocol", err)
	}
}
