package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/operator"
)

// SnapshotChunkBytes is the default size of the pieces FetchSnapshot
// streams an encoded task snapshot in (Options.SnapshotChunkBytes): well
// under the data plane's 16 MiB message limit, so a snapshot of any size
// crosses as a sequence of messages and neither side builds one giant
// message, and large enough that per-message costs do not count.
const SnapshotChunkBytes = 4 << 20

// MaxFetchedSnapshotBytes bounds the snapshot a worker accepts from a
// peer, so a peer announcing a corrupt size cannot make it allocate
// without bound.
const MaxFetchedSnapshotBytes = 8 << 30

// ErrSnapshotTransfer means a snapshot fetched from another worker did
// not arrive whole: the peer announced no size or a size beyond
// MaxFetchedSnapshotBytes, or sent more or fewer bytes than announced.
var ErrSnapshotTransfer = errors.New("task snapshot transfer incomplete")

// dpServer is the DataPlane service of a runtime: the data plane's
// streams and ingest (dataplane.Server) plus task snapshots, which only
// the runtime can take.
type dpServer struct {
	*dataplane.Server
	r *Runtime
}

// FetchSnapshot takes a snapshot of the task copy the request names
// (SnapshotTask; with Halt, stop-and-copy) and streams its encoding in
// SnapshotChunkBytes pieces. Who may call it is the worker's business
// (rpc/authz: the org's workers only).
func (s dpServer) FetchSnapshot(req *fedstreampb.FetchSnapshotRequest, stream fedstreampb.DataPlane_FetchSnapshotServer) error {
	ctx := stream.Context()
	t := s.r.task(req.TaskId)
	if t == nil || t.spec.Query != req.Query {
		return status.Errorf(codes.NotFound, "no task %q of query %q runs on this worker", req.TaskId, req.Query)
	}
	if gen := max(t.spec.Generation, 1); req.Generation != 0 && int(req.Generation) != gen {
		return status.Errorf(codes.NotFound, "task %q runs here as generation %d, not %d", req.TaskId, gen, req.Generation)
	}
	began := time.Now()
	snap, prepare, err := t.capture(ctx, SnapshotOptions{Halt: req.Halt})
	captured := time.Now()
	var enc *operator.Encoding
	if err == nil && prepare != nil {
		// The task processes again while its captured state is sorted,
		// sized and encoded.
		if enc, err = prepare(); err != nil {
			err = fmt.Errorf("task %s: operator snapshot: %w", t.spec.TaskID, err)
		}
	}
	if err != nil {
		if errors.Is(err, ErrNotSnapshottable) {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		return status.Error(codes.Unavailable, err.Error())
	}
	if enc == nil && snap.Operator != nil {
		enc = operator.BytesEncoding(snap.Operator)
	}
	prepared := time.Now()
	head, rest := snap.marshalAround(enc != nil, encSize(enc))
	total := len(head) + encSize(enc) + len(rest)
	// Pieces of at most size bytes are sent as they are (the data plane's
	// codec does not copy them), the operator state's as it is encoded:
	// its size is known first, so the total is announced with the first
	// piece and the transfer overlaps the encoding.
	size := s.r.opts.SnapshotChunkBytes
	chunks := 0
	first := true
	send := func(part []byte) error {
		for off := 0; off < len(part); off += size {
			chunk := &fedstreampb.SnapshotChunk{Data: part[off:min(off+size, len(part))]}
			if first {
				chunk.TotalBytes = uint64(total)
				first = false
			}
			if err := stream.Send(chunk); err != nil {
				return err
			}
			chunks++
		}
		return nil
	}
	if err := send(head); err != nil {
		return err
	}
	if enc != nil {
		sent := 0
		if err := enc.Write(func(p []byte) error { sent += len(p); return send(p) }); err != nil {
			return err
		}
		if sent != enc.Size {
			return status.Errorf(codes.Internal, "task %s: operator state encoded in %d bytes, announced %d", t.spec.TaskID, sent, enc.Size)
		}
	}
	if err := send(rest); err != nil {
		return err
	}
	s.r.snapshotsServed.Add(1)
	s.r.snapshotBytes.Add(uint64(total))
	t.log.Info("snapshot served", "halt", req.Halt, "bytes", total, "released", snap.Released, "chunks", chunks, "took", time.Since(began),
		"capture", captured.Sub(began), "prepare", prepared.Sub(captured), "encode_and_send", time.Since(prepared))
	return nil
}

// encSize is enc's size, 0 for nil.
func encSize(enc *operator.Encoding) int {
	if enc == nil {
		return 0
	}
	return enc.Size
}

// retryableFetch reports whether a failed FetchSnapshot may succeed if
// tried again: the transfer broke off, not a refusal of the serving
// worker.
func retryableFetch(err error) bool {
	if errors.Is(err, ErrSnapshotTransfer) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// Bootstraps is how many tasks this runtime started from a snapshot
// fetched from another worker (TaskSpec.Bootstrap).
func (r *Runtime) Bootstraps() uint64 { return r.bootstraps.Load() }

// StartedFromSnapshot reports whether the task with the given id runs
// here from a snapshot (TaskSpec.FromSnapshot or Bootstrap), rather than
// from the start of its upstreams' buffers.
func (r *Runtime) StartedFromSnapshot(taskID string) bool {
	t := r.task(taskID)
	return t != nil && t.restored
}

// SnapshotsServed is how many task snapshots this runtime's FetchSnapshot
// has served (moves out of it, peers bootstrapped from it).
func (r *Runtime) SnapshotsServed() uint64 { return r.snapshotsServed.Load() }

// SnapshotBytesServed is the total encoded size of the task snapshots this
// runtime's FetchSnapshot has served.
func (r *Runtime) SnapshotBytesServed() uint64 { return r.snapshotBytes.Load() }

// FetchSnapshot asks the worker behind conn for a snapshot of one copy of
// a task (see the DataPlane FetchSnapshot RPC) and decodes it.
func FetchSnapshot(ctx context.Context, conn grpc.ClientConnInterface, req *fedstreampb.FetchSnapshotRequest) (*TaskSnapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).FetchSnapshot(ctx, req, dataplane.SnapshotCallOptions()...)
	if err != nil {
		return nil, fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, err)
	}
	// Each chunk's data is copied once, from the received frames into
	// enc, allocated at the announced size.
	chunk := dataplane.SnapshotChunkInto{MaxBytes: MaxFetchedSnapshotBytes}
	var total uint64

	for first := true; ; first = false {
		err := stream.RecvMsg(&chunk)
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, dataplane.ErrSnapshotOverflow) {
			return nil, fmt.Errorf("%w: %s: %v", ErrSnapshotTransfer, req.TaskId, err)
		}
		if err != nil {
			return nil, fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, err)
		}
		if first && (chunk.TotalBytes == 0 || chunk.Dst == nil) {
			return nil, fmt.Errorf("%w: %s: announced size %d", ErrSnapshotTransfer, req.TaskId, chunk.TotalBytes)
		}
		if first {
			total = chunk.TotalBytes
		}
	}
	enc := chunk.Dst
	if uint64(len(enc)) != total || total == 0 {
		return nil, fmt.Errorf("%w: %s: %d of %d bytes", ErrSnapshotTransfer, req.TaskId, len(enc), total)
	}
	var snap TaskSnapshot
	// enc is ours alone: the snapshot, and the operators restored from
	// it, may keep slices of it.
	if err := snap.unmarshal(enc, true); err != nil {
		return nil, fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, err)
	}
	snap.opOwned = true
	return &snap, nil
}
