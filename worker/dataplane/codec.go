package dataplane

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec batchCodec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// batchCodec is the gRPC codec of data-plane connections. It is wire
// compatible with the standard "proto" codec (and names itself so), but
// moves Batch messages without the standard codec's copies:
//
//   - Marshal does not copy Batch.Data: the message is a small header plus
//     Data itself. That is safe because batches the server sends alias an
//     OutputBuffer's chunks, whose written bytes are never modified (see
//     chunk), so gRPC may hold them until they are written to the socket.
//   - Unmarshal copies the received frames once into a fresh slice that
//     Batch.Data then aliases (the standard codec gathers the frames into a
//     pooled buffer, zeroing a 1 MiB pool tier for a 64 KiB batch, then
//     copies Data out again). Data is never reused, as Batch promises.
//
// Every other message goes through the standard codec.
type batchCodec struct{ fallback encoding.CodecV2 }

func newBatchCodec() batchCodec {
	return batchCodec{fallback: encoding.GetCodecV2("proto")}
}

// Name is "proto": peers using the standard codec see the same content
// subtype and the same bytes.
func (batchCodec) Name() string { return "proto" }

// Protobuf field numbers of Batch (rpc/fedstream.proto).
const (
	batchFieldData   protowire.Number = 1
	batchFieldCount  protowire.Number = 2
	batchFieldLastID protowire.Number = 3
	// DCAA in-band stream state (issue 10).
	batchFieldReplicaState protowire.Number = 180
	batchFieldTentWM       protowire.Number = 181
	batchFieldPosOffset    protowire.Number = 200
	// DCAA lineage of stable ids (OutputBuffer.Diverge).
	batchFieldLineage      protowire.Number = 630
	batchFieldLineageSince protowire.Number = 631
	// Ranges of the stream's UNCORRECTABLE records
	// (OutputBuffer.NamedRanges), packed sint64 pairs.
	batchFieldNamedRanges protowire.Number = 656
)

func (c batchCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*fedstreampb.Batch)
	if !ok {
		if chunk, ok := v.(*fedstreampb.SnapshotChunk); ok {
			return marshalChunk(chunk), nil
		}
		return c.fallback.Marshal(v)
	}
	// Fields in any order are valid protobuf: the small ones first, then
	// the data field's key and length, all in one header; Data follows
	// as a buffer of its own.
	hdr := make([]byte, 0, 32)
	if b.Count != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldCount, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, uint64(b.Count))
	}
	if b.LastId != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldLastID, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, b.LastId)
	}
	if b.ReplicaState != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldReplicaState, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, uint64(b.ReplicaState))
	}
	if b.TentativeWatermark != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldTentWM, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, protowire.EncodeZigZag(b.TentativeWatermark))
	}
	if b.PositionOffset != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldPosOffset, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, b.PositionOffset)
	}
	if b.Lineage != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldLineage, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, b.Lineage)
	}
	if b.LineageSince != 0 {
		hdr = protowire.AppendTag(hdr, batchFieldLineageSince, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, b.LineageSince)
	}
	if len(b.NamedRanges) > 0 {
		var packed []byte
		for _, v := range b.NamedRanges {
			packed = protowire.AppendVarint(packed, protowire.EncodeZigZag(v))
		}
		hdr = protowire.AppendTag(hdr, batchFieldNamedRanges, protowire.BytesType)
		hdr = protowire.AppendBytes(hdr, packed)
	}
	if len(b.Data) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(hdr)}, nil
	}
	hdr = protowire.AppendTag(hdr, batchFieldData, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(b.Data)))
	return mem.BufferSlice{mem.SliceBuffer(hdr), mem.SliceBuffer(b.Data)}, nil
}

// receivedBatch is a Batch a subscriber receives. With pooled set, the
// message is copied into a buffer of sharedDirtyPool, buf, which whoever
// knows that nothing aliases Data any more hands back to the pool (a
// subscriber whose consumer only copies tuples); otherwise it is copied
// into memory of its own for good, as for a plain Batch.
type receivedBatch struct {
	fedstreampb.Batch
	pooled bool
	buf    *[]byte
}

func (c batchCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if rb, ok := v.(*receivedBatch); ok {
		if !rb.pooled {
			return unmarshalBatch(ownedCopy(data), &rb.Batch)
		}
		rb.buf = sharedDirtyPool.Get(data.Len())
		data.CopyTo(*rb.buf)
		return unmarshalBatch(*rb.buf, &rb.Batch)
	}
	if chunk, ok := v.(*SnapshotChunkInto); ok {
		return unmarshalChunkInto(data, chunk)
	}
	b, ok := v.(*fedstreampb.Batch)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	// One copy into memory this Batch owns for good: Data aliases it.
	return unmarshalBatch(ownedCopy(data), b)
}

// unmarshalBatch decodes a Batch message whose Data then aliases raw.
func unmarshalBatch(raw []byte, b *fedstreampb.Batch) error {
	b.Reset()
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return fmt.Errorf("%w: batch: %w", ErrProtocol, protowire.ParseError(n))
		}
		raw = raw[n:]
		switch {
		case num == batchFieldData && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(raw)
			if n < 0 {
				return fmt.Errorf("%w: batch data: %w", ErrProtocol, protowire.ParseError(n))
			}
			b.Data = v[:len(v):len(v)]
			raw = raw[n:]
		case num == batchFieldCount && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "count")
			if err != nil {
				return err
			}
			b.Count = uint32(v)
		case num == batchFieldLastID && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "last id")
			if err != nil {
				return err
			}
			b.LastId = v
		case num == batchFieldPosOffset && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "position offset")
			if err != nil {
				return err
			}
			b.PositionOffset = v
		case num == batchFieldLineage && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "lineage")
			if err != nil {
				return err
			}
			b.Lineage = v
		case num == batchFieldLineageSince && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "lineage since")
			if err != nil {
				return err
			}
			b.LineageSince = v
		case num == batchFieldNamedRanges && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(raw)
			if n < 0 {
				return fmt.Errorf("%w: batch named ranges: %w", ErrProtocol, protowire.ParseError(n))
			}
			raw = raw[n:]
			for len(v) > 0 {
				x, err := consumeVarint(&v, "named range")
				if err != nil {
					return err
				}
				b.NamedRanges = append(b.NamedRanges, protowire.DecodeZigZag(x))
			}
		case num == batchFieldNamedRanges && typ == protowire.VarintType:
			x, err := consumeVarint(&raw, "named range")
			if err != nil {
				return err
			}
			b.NamedRanges = append(b.NamedRanges, protowire.DecodeZigZag(x))
		case num == batchFieldReplicaState && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "replica state")
			if err != nil {
				return err
			}
			b.ReplicaState = fedstreampb.ReplicaState(int32(v))
		case num == batchFieldTentWM && typ == protowire.VarintType:
			v, err := consumeVarint(&raw, "tentative watermark")
			if err != nil {
				return err
			}
			b.TentativeWatermark = protowire.DecodeZigZag(v)
		default:
			// A field this version does not know: skip it.
			n := protowire.ConsumeFieldValue(num, typ, raw)
			if n < 0 {
				return fmt.Errorf("%w: batch field %d: %w", ErrProtocol, num, protowire.ParseError(n))
			}
			raw = raw[n:]
		}
	}
	return nil
}

// consumeVarint takes a varint field's value off the front of *raw; what
// names the field in the error.
func consumeVarint(raw *[]byte, what string) (uint64, error) {
	v, n := protowire.ConsumeVarint(*raw)
	if n < 0 {
		return 0, fmt.Errorf("%w: batch %s: %w", ErrProtocol, what, protowire.ParseError(n))
	}
	*raw = (*raw)[n:]
	return v, nil
}

// dirtyPool is the gRPC buffer pool of data-plane connections: tiers of
// power-of-two sizes, like gRPC's default pool, but buffers are not zeroed
// when reused. gRPC overwrites what it reads into them before using it, and
// zeroing costs: the default pool clears the whole capacity of a reused
// buffer, 1 MiB for anything above 32 KiB.
type dirtyPool struct {
	// tiers[i] holds buffers of capacity 1<<(minPoolShift+i).
	tiers [maxPoolShift - minPoolShift + 1]sync.Pool
}

const (
	minPoolShift = 8  // 256 B
	maxPoolShift = 22 // 4 MiB; larger requests are plain allocations
)

var sharedDirtyPool = &dirtyPool{}

func tierOf(size int) int {
	if size <= 1<<minPoolShift {
		return 0
	}
	return bits.Len(uint(size-1)) - minPoolShift
}

// Get returns a buffer of length size; its contents are arbitrary.
func (p *dirtyPool) Get(size int) *[]byte {
	t := tierOf(size)
	if t >= len(p.tiers) {
		b := make([]byte, size)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<(minPoolShift+t))
	return &b
}

// Put returns a buffer obtained from Get (or a prefix of one).
func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minPoolShift || c&(c-1) != 0 {
		return // not one of ours: let the GC have it
	}
	t := tierOf(c)
	if t >= len(p.tiers) {
		return
	}
	*b = (*b)[:0]
	p.tiers[t].Put(b)
}

// ownedCopy copies a received message into new memory. Unlike
// BufferSlice.Materialize it does not clear the memory first (the copy
// overwrites all of it), which for batches of tens of KiB was a measurable
// share of the receive path.
func ownedCopy(data mem.BufferSlice) []byte {
	out := allocUncleared(data.Len())
	data.CopyTo(out)
	return out
}

// Protobuf field numbers of SnapshotChunk (rpc/fedstream.proto).
const (
	chunkFieldData  protowire.Number = 1
	chunkFieldTotal protowire.Number = 2
	// Fast snapshot transfer's offer (see runtime's bulk transfer).
	chunkFieldBulkPort  protowire.Number = 246
	chunkFieldBulkToken protowire.Number = 247
)

// marshalChunk encodes a SnapshotChunk without copying Data: a small
// header (total_bytes, then data's key and length) and Data itself. A
// snapshot's bytes are never modified once encoded, so gRPC may hold
// them until they are written.
func marshalChunk(c *fedstreampb.SnapshotChunk) mem.BufferSlice {
	hdr := make([]byte, 0, 24)
	if c.TotalBytes != 0 {
		hdr = protowire.AppendTag(hdr, chunkFieldTotal, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, c.TotalBytes)
	}
	if c.BulkPort != 0 {
		hdr = protowire.AppendTag(hdr, chunkFieldBulkPort, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, uint64(c.BulkPort))
	}
	if len(c.BulkToken) > 0 {
		hdr = protowire.AppendTag(hdr, chunkFieldBulkToken, protowire.BytesType)
		hdr = protowire.AppendBytes(hdr, c.BulkToken)
	}
	if len(c.Data) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(hdr)}
	}
	hdr = protowire.AppendTag(hdr, chunkFieldData, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(c.Data)))
	return mem.BufferSlice{mem.SliceBuffer(hdr), mem.SliceBuffer(c.Data)}
}

// SnapshotChunkInto receives a SnapshotChunk message (RecvMsg of a
// FetchSnapshot stream called with SnapshotCallOptions) straight into a
// buffer: its data is copied once, from the received frames to the end
// of Dst, which must have the room for it (cap(Dst)-len(Dst)). While Dst
// is nil, a chunk announcing TotalBytes (the first) allocates Dst with
// that capacity, if it is at most MaxBytes. A chunk with more data than
// the room left is refused (ErrSnapshotOverflow).
type SnapshotChunkInto struct {
	// TotalBytes is the chunk's total_bytes (0 when absent).
	TotalBytes uint64
	Dst        []byte
	MaxBytes   uint64
	// BulkPort and BulkToken are the chunk's offer of a connection of its
	// own for the snapshot's bytes (0 and nil when absent).
	BulkPort  uint32
	BulkToken []byte
}

// maxBulkToken bounds the token of a bulk transfer offer.
const maxBulkToken = 64

// ErrSnapshotOverflow means a snapshot chunk carried more bytes than
// the snapshot's announced size leaves room for.
var ErrSnapshotOverflow = errors.New("dataplane: snapshot chunk beyond the announced size")

// unmarshalChunkInto decodes a SnapshotChunk from the received frames
// into c (see SnapshotChunkInto).
func unmarshalChunkInto(data mem.BufferSlice, c *SnapshotChunkInto) error {
	cur := frameCursor{}
	for _, b := range data {
		if d := b.ReadOnlyData(); len(d) > 0 {
			cur.bufs = append(cur.bufs, d)
		}
	}
	c.TotalBytes, c.BulkPort, c.BulkToken = 0, 0, nil
	// early holds data that came before the total (a peer that encodes
	// fields in number order) while Dst is not allocated yet.
	var early []byte
	for !cur.empty() {
		tag, err := cur.varint()
		if err != nil {
			return err
		}
		num, typ := protowire.DecodeTag(tag)
		switch {
		case num == chunkFieldTotal && typ == protowire.VarintType:
			if c.TotalBytes, err = cur.varint(); err != nil {
				return err
			}
			if c.Dst == nil && c.TotalBytes > 0 {
				if c.TotalBytes > c.MaxBytes {
					return fmt.Errorf("%w: announced size %d, at most %d", ErrSnapshotOverflow, c.TotalBytes, c.MaxBytes)
				}
				// Not zeroed: only what is received is ever read.
				c.Dst = allocUncleared(int(c.TotalBytes))[:0]
			}
		case num == chunkFieldBulkPort && typ == protowire.VarintType:
			v, err := cur.varint()
			if err != nil {
				return err
			}
			if v == 0 || v > 65535 {
				return fmt.Errorf("%w: snapshot chunk offers port %d", ErrProtocol, v)
			}
			c.BulkPort = uint32(v)
		case num == chunkFieldBulkToken && typ == protowire.BytesType:
			n, err := cur.varint()
			if err != nil {
				return err
			}
			if n > maxBulkToken || n > uint64(cur.len()) {
				return fmt.Errorf("%w: snapshot chunk token of %d bytes", ErrProtocol, n)
			}
			c.BulkToken = make([]byte, n)
			if err := cur.read(c.BulkToken); err != nil {
				return err
			}
		case num == chunkFieldData && typ == protowire.BytesType:
			n, err := cur.varint()
			if err != nil {
				return err
			}
			if c.Dst == nil && early == nil && n <= uint64(cur.len()) {
				early = make([]byte, n)
				if err := cur.read(early); err != nil {
					return err
				}
				continue
			}
			if n > uint64(cap(c.Dst)-len(c.Dst)) {
				return fmt.Errorf("%w: %d bytes, room for %d", ErrSnapshotOverflow, n, cap(c.Dst)-len(c.Dst))
			}
			end := len(c.Dst) + int(n)
			if err := cur.read(c.Dst[len(c.Dst):end]); err != nil {
				return err
			}
			c.Dst = c.Dst[:end]
		default:
			var skip uint64
			switch typ {
			case protowire.VarintType:
				_, err = cur.varint()
			case protowire.Fixed32Type:
				skip = 4
			case protowire.Fixed64Type:
				skip = 8
			case protowire.BytesType:
				skip, err = cur.varint()
			default:
				return fmt.Errorf("%w: snapshot chunk field %d of wire type %d", ErrProtocol, num, typ)
			}
			if err == nil {
				err = cur.skip(skip)
			}
			if err != nil {
				return err
			}
		}
	}
	if early != nil {
		if uint64(len(early)) > uint64(cap(c.Dst)-len(c.Dst)) {
			return fmt.Errorf("%w: %d bytes, room for %d", ErrSnapshotOverflow, len(early), cap(c.Dst)-len(c.Dst))
		}
		c.Dst = append(c.Dst, early...)
	}
	return nil
}

// frameCursor reads a message spread over several received buffers.
type frameCursor struct{ bufs [][]byte }

var errChunkTruncated = fmt.Errorf("%w: truncated snapshot chunk", ErrProtocol)

func (f *frameCursor) empty() bool { return len(f.bufs) == 0 }

func (f *frameCursor) len() int {
	n := 0
	for _, b := range f.bufs {
		n += len(b)
	}
	return n
}

func (f *frameCursor) byte() (byte, error) {
	if len(f.bufs) == 0 {
		return 0, errChunkTruncated
	}
	v := f.bufs[0][0]
	if f.bufs[0] = f.bufs[0][1:]; len(f.bufs[0]) == 0 {
		f.bufs = f.bufs[1:]
	}
	return v, nil
}

func (f *frameCursor) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b, err := f.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: snapshot chunk varint overflows", ErrProtocol)
}

// read fills dst.
func (f *frameCursor) read(dst []byte) error {
	for len(dst) > 0 {
		if len(f.bufs) == 0 {
			return errChunkTruncated
		}
		n := copy(dst, f.bufs[0])
		dst = dst[n:]
		if f.bufs[0] = f.bufs[0][n:]; len(f.bufs[0]) == 0 {
			f.bufs = f.bufs[1:]
		}
	}
	return nil
}

func (f *frameCursor) skip(n uint64) error {
	for n > 0 {
		if len(f.bufs) == 0 {
			return errChunkTruncated
		}
		k := min(n, uint64(len(f.bufs[0])))
		if f.bufs[0] = f.bufs[0][k:]; len(f.bufs[0]) == 0 {
			f.bufs = f.bufs[1:]
		}
		n -= k
	}
	return nil
}

// SnapshotCallOptions are the call options of a FetchSnapshot call whose
// chunks are received with SnapshotChunkInto: the data plane's codec,
// whatever the connection's default, and messages up to MaxMessageBytes.
func SnapshotCallOptions() []grpc.CallOption {
	return []grpc.CallOption{grpc.ForceCodecV2(newBatchCodec()), grpc.MaxCallRecvMsgSize(maxMessageSize)}
}
