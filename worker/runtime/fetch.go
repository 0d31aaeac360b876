package runtime

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/rpc"
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
	if f := s.r.snapshotFault.Load(); f != nil {
		if err := (*f)(req.TaskId); errors.Is(err, errTentativeNow) {
			return status.Error(codes.Aborted, err.Error())
		}
	}
	began := time.Now()
	bsrv := s.r.bulkSrv.Load()
	bulk := req.Bulk && bsrv != nil
	// inline: the offer goes out first, the size comes on the connection,
	// so the caller connects (TLS handshake included) while the state is
	// captured and sized.
	inline := bulk && req.BulkSizeInline
	var (
		token   []byte
		conns   <-chan net.Conn
		release func()
	)
	if bulk {
		var err error
		if token, conns, release, err = bsrv.offer(); err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		defer release()
	}
	if inline {
		if err := stream.Send(&fedstreampb.SnapshotChunk{BulkPort: bsrv.port, BulkToken: token}); err != nil {
			return err
		}
	}
	snap, prepare, err := t.capture(ctx, SnapshotOptions{Halt: req.Halt})
	captured := time.Now()
	if err == nil && !req.Halt {
		t.supersede(req.PlacedIndex)
	}
	var enc *operator.Encoding
	if err == nil && prepare != nil {
		// The task processes again while its captured state is sorted,
		// sized and encoded.
		if enc, err = prepare(); err != nil {
			err = fmt.Errorf("task %s: operator snapshot: %w", t.spec.TaskID, err)
		}
	}
	if err != nil {
		if errors.Is(err, errTentativeNow) {
			return status.Error(codes.Aborted, err.Error()) // passes: ask again
		}
		if errors.Is(err, ErrNotSnapshottable) {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		return status.Error(codes.Unavailable, err.Error())
	}
	if snap, err = snapshotForLevel(snap, req.DataplaneLevel); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if enc == nil && snap.Operator != nil {
		enc = operator.BytesEncoding(snap.Operator)
	}
	prepared := time.Now()
	head, rest := snap.marshalAround(enc != nil, encSize(enc))
	total := len(head) + encSize(enc) + len(rest)
	// write emits the whole encoding in consecutive parts, the operator
	// state's as it is encoded: its size is known first, so the total is
	// announced before the first part and the transfer overlaps the
	// encoding.
	// With transient, emit keeps no part once it returns (a bulk
	// connection's writes copy them), so the encoding reuses a few
	// buffers instead of allocating the state's whole size.
	write := func(emit func([]byte) error, transient bool) error {
		if err := emit(head); err != nil {
			return err
		}
		if enc != nil {
			sent := 0
			counted := func(p []byte) error { sent += len(p); return emit(p) }
			var err error
			if transient {
				err = enc.WriteTransient(counted)
			} else {
				err = enc.Write(counted)
			}
			if err != nil {
				return err
			}
			if sent != enc.Size {
				return status.Errorf(codes.Internal, "task %s: operator state encoded in %d bytes, announced %d", t.spec.TaskID, sent, enc.Size)
			}
		}
		return emit(rest)
	}
	chunks := 0
	var firstSent time.Time
	if bulk {
		// Over a connection of its own (bulk.go): the offer (made above
		// when inline), then the bytes there, after their size when
		// inline.
		if !inline {
			if err := stream.Send(&fedstreampb.SnapshotChunk{TotalBytes: uint64(total), BulkPort: bsrv.port, BulkToken: token}); err != nil {
				return err
			}
		}
		if firstSent, err = serveBulk(ctx, conns, func(emit func([]byte) error) error {
			if inline {
				if err := emit(binary.BigEndian.AppendUint64(nil, uint64(total))); err != nil {
					return err
				}
			}
			return write(emit, true)
		}); err != nil {
			if status.Code(err) == codes.Internal {
				return err
			}
			return status.Errorf(codes.Unavailable, "task %s: snapshot over the bulk connection: %v", t.spec.TaskID, err)
		}
	} else {
		// Pieces of at most size bytes are sent as they are (the data
		// plane's codec does not copy them).
		size := s.r.opts.SnapshotChunkBytes
		first := true
		send := func(part []byte) error {
			for off := 0; off < len(part); off += size {
				chunk := &fedstreampb.SnapshotChunk{Data: part[off:min(off+size, len(part))]}
				if first {
					chunk.TotalBytes = uint64(total)
					first = false
					firstSent = time.Now()
				}
				if err := stream.Send(chunk); err != nil {
					return err
				}
				chunks++
			}
			return nil
		}
		if err := write(send, false); err != nil {
			return err
		}
	}
	if bulk {
		s.r.bulkServed.Add(1)
	}
	lastSent := time.Now()
	s.r.noteServed(ServeTiming{Task: t.spec.TaskID, Bytes: total, Bulk: bulk, Capture: captured.Sub(began), Prepare: prepared.Sub(captured), Send: lastSent.Sub(prepared),
		Began: began, Captured: captured, Prepared: prepared, FirstSent: firstSent, LastSent: lastSent})
	s.r.snapshotsServed.Add(1)
	s.r.snapshotBytes.Add(uint64(total))
	t.log.Info("snapshot served", "halt", req.Halt, "bytes", total, "released", snap.Released, "chunks", chunks, "bulk", bulk, "took", time.Since(began),
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
// fetchTentativeWait is how long a bootstrap keeps asking a DCAA peer
// that refuses its snapshot because its results are tentative now
// (codes.Aborted, errTentativeNow): on a loaded machine failure detection
// may take a live upstream for failed, and the peer corrects itself
// within a few detection timeouts. Started without the snapshot instead,
// the copy replays from its upstreams' buffers, which no longer hold the
// start of the stream: a replacement of a lossy replica was lossy again
// and replaced again, over and over.
const fetchTentativeWait = 5 * time.Second

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

// SnapshotsServedBulk is how many of SnapshotsServed crossed over a
// connection of their own (fast snapshot transfer, BulkOptions).
func (r *Runtime) SnapshotsServedBulk() uint64 { return r.bulkServed.Load() }

// SnapshotBytesServed is the total encoded size of the task snapshots this
// runtime's FetchSnapshot has served.
func (r *Runtime) SnapshotBytesServed() uint64 { return r.snapshotBytes.Load() }

// FetchSnapshot asks the worker behind conn for a snapshot of one copy of
// a task (see the DataPlane FetchSnapshot RPC) and decodes it. Its bytes
// come over the call's stream (Runtime fetches them over a connection of
// their own where the serving worker offers one: fetchSnapshot).
func FetchSnapshot(ctx context.Context, conn grpc.ClientConnInterface, req *fedstreampb.FetchSnapshotRequest) (*TaskSnapshot, error) {
	return fetchSnapshot(ctx, conn, "", req, nil, nil)
}

// fetchSnapshot is FetchSnapshot from the worker at addr asking, with
// bulk, for the bytes over a connection of their own (bulk.go). When that
// connection cannot be made, it fetches again over the stream.
func (r *Runtime) fetchSnapshot(ctx context.Context, conn grpc.ClientConnInterface, addr string, req *fedstreampb.FetchSnapshotRequest, fo *fetchOpts) (*TaskSnapshot, error) {
	streaming := fo != nil && fo.restoreStream != nil && !fo.noStream
	snap, err := fetchSnapshot(ctx, conn, addr, req, r.bulkCli, fo)
	if err != nil && streaming {
		// The operator state restored off the connection is gone with
		// the failed attempt: every later one keeps the whole snapshot
		// (restoring while it arrives, and from it if that fails).
		fo.noStream = true
		if errors.Is(err, errStreamRestore) && ctx.Err() == nil {
			r.log.Warn("restoring the operator state off the connection failed: fetching the snapshot again whole", "task", req.TaskId, "err", err)
			r.streamFallbacks.Add(1)
			snap, err = fetchSnapshot(ctx, conn, addr, req, r.bulkCli, fo)
		}
	}
	if errors.Is(err, errBulkConnect) && ctx.Err() == nil {
		r.log.Warn("fast snapshot transfer failed: fetching over the data plane stream", "task", req.TaskId, "worker", addr, "err", err)
		snap, err = fetchSnapshot(ctx, conn, addr, req, nil, fo)
	}
	if fo != nil && fo.earlyErr != nil && err == nil {
		r.log.Warn("restoring the operator state while it arrived failed: restoring it from the whole snapshot", "task", req.TaskId, "err", fo.earlyErr)
	}
	return snap, err
}

// fetchOpts are what a bootstrap adds to a fetch (all optional): restoring
// the operator state while it arrives, and when the bytes came.
type fetchOpts struct {
	// restore, when set, runs on a goroutine of its own once the bytes
	// start to come over a bulk connection, and restores the task's
	// operators from them as they arrive (restoreEarly). What it returns
	// is the snapshot's early when the fetch succeeds; its error (earlyErr)
	// only means the task restores from the whole snapshot instead.
	restore func(in *operator.Incoming) (*earlyOp, error)
	// restoreStream, when set, restores the task's operators from the
	// next size bytes of br: the first attempt over a bulk connection
	// then decodes the operator state off the connection without keeping
	// it (streamfetch.go); noStream, set once such an attempt failed,
	// makes later ones keep the whole snapshot (restore). tamper, in
	// tests, wraps the connection's bytes before they are decoded.
	restoreStream func(br *bufio.Reader, size int) (*earlyOp, error)
	noStream      bool
	tamper        func(io.Reader) io.Reader

	// Set by the fetch (the last attempt): the first and last byte of the
	// snapshot arrived, it was decoded (its operator state installed, when
	// early), earlyErr why restoring while it arrived failed.
	firstByte, lastByte, decoded time.Time
	earlyErr                     error
	// interned: the operator state was restored off the connection and
	// not kept (restoreStream).
	interned bool
}

// errFetchEnded ends the wait of an early restore for bytes that will not
// come: the fetch gave up.
var errFetchEnded = errors.New("snapshot fetch ended")

// bulkFailed is the error of a fetch whose bulk transfer failed with err.
// The serving worker may have refused after its offer (an inline offer
// goes out before the snapshot is taken): its answer then says why.
func bulkFailed(ctx context.Context, stream grpc.ClientStream, req *fedstreampb.FetchSnapshotRequest, err error) error {
	if !errors.Is(err, errBulkConnect) && !errors.Is(err, errStreamRestore) && ctx.Err() == nil {
		var extra dataplane.SnapshotChunkInto
		if serr := stream.RecvMsg(&extra); serr != nil && !errors.Is(serr, io.EOF) && status.Code(serr) != codes.Unavailable {
			return fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, serr)
		}
	}
	return fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, err)
}

// bulkEnded checks that the call ends once the bulk transfer is done: the
// server ends it once it has written everything, so an error there (or
// more data) means the bytes are not to be trusted.
func bulkEnded(stream grpc.ClientStream, req *fedstreampb.FetchSnapshotRequest) error {
	var extra dataplane.SnapshotChunkInto
	if err := stream.RecvMsg(&extra); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("data after the bulk transfer")
		}
		return fmt.Errorf("%w: %s: %w", ErrSnapshotTransfer, req.TaskId, err)
	}
	return nil
}

func fetchSnapshot(ctx context.Context, conn grpc.ClientConnInterface, addr string, req *fedstreampb.FetchSnapshotRequest, bulk *bulkClient, fo *fetchOpts) (*TaskSnapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req = proto.CloneOf(req)
	req.Bulk = bulk != nil
	req.BulkSizeInline = bulk != nil
	if req.DataplaneLevel == 0 {
		req.DataplaneLevel = rpc.DataPlaneLevel
	}
	stream, err := fedstreampb.NewDataPlaneClient(conn).FetchSnapshot(ctx, req, dataplane.SnapshotCallOptions()...)
	if err != nil {
		return nil, fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, err)
	}
	// Each chunk's data is copied once, from the received frames into
	// enc, allocated at the announced size.
	chunk := dataplane.SnapshotChunkInto{MaxBytes: MaxFetchedSnapshotBytes}
	var total uint64
	if fo != nil {
		fo.firstByte, fo.lastByte, fo.decoded, fo.earlyErr, fo.interned = time.Time{}, time.Time{}, time.Time{}, nil, false
	}
	// streamed is what a fetch restoring off the connection got.
	var streamed *streamedFetch
	// waitEarly waits for the restore of the operator state while it
	// arrived (fetchOpts.restore), when one runs; stopEarly ends it.
	var waitEarly func() (*earlyOp, error)
	var stopEarly func()
	defer func() {
		if stopEarly != nil {
			stopEarly()
		}
	}()

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
		// An offer of a bulk connection may leave the size to it (asked
		// for with BulkSizeInline).
		inline := first && chunk.BulkPort != 0 && chunk.TotalBytes == 0 && chunk.Dst == nil
		if first && !inline && (chunk.TotalBytes == 0 || chunk.Dst == nil) {
			return nil, fmt.Errorf("%w: %s: announced size %d", ErrSnapshotTransfer, req.TaskId, chunk.TotalBytes)
		}
		if first {
			total = chunk.TotalBytes
		}
		if chunk.BulkPort == 0 {
			if fo != nil && len(chunk.Dst) > 0 && fo.firstByte.IsZero() {
				fo.firstByte = time.Now()
			}
			continue
		}
		// The bytes come over a connection of their own: only the first
		// message may offer it, and only when asked.
		if !first || bulk == nil || len(chunk.Dst) != 0 {
			return nil, fmt.Errorf("%w: %s: unexpected offer of a bulk connection", ErrSnapshotTransfer, req.TaskId)
		}
		if fo != nil && fo.restoreStream != nil && !fo.noStream {
			size := 0
			if !inline {
				size = int(total)
			}
			if streamed, err = bulk.receiveStreamed(ctx, addr, chunk.BulkPort, chunk.BulkToken, size, fo); err != nil {
				return nil, bulkFailed(ctx, stream, req, err)
			}
			total = uint64(len(streamed.enc))
			chunk.Dst = streamed.enc
			if err := bulkEnded(stream, req); err != nil {
				return nil, err
			}
			break
		}
		var dst []byte
		if !inline {
			dst = chunk.Dst[:total]
		}
		// started is called once the buffer is there: the operator state
		// is then restored while it arrives (fetchOpts.restore), on a
		// goroutine that ends once every byte is there or the fetch gives
		// up (Fail); the fetch waits for it before it returns.
		var started func(dst []byte) *operator.Incoming
		if fo != nil && fo.restore != nil {
			started = func(dst []byte) *operator.Incoming {
				in := operator.NewIncoming(dst)
				done := make(chan struct{})
				var op *earlyOp
				var opErr error
				go func() {
					defer close(done)
					op, opErr = fo.restore(in)
				}()
				stopEarly = func() {
					in.Fail(errFetchEnded)
					<-done
				}
				waitEarly = func() (*earlyOp, error) {
					<-done
					return op, opErr
				}
				return in
			}
		}
		dst, err = bulk.receive(ctx, addr, chunk.BulkPort, chunk.BulkToken, dst, started, fo)
		if err != nil {
			return nil, bulkFailed(ctx, stream, req, err)
		}
		total = uint64(len(dst))
		chunk.Dst = dst
		if err := bulkEnded(stream, req); err != nil {
			return nil, err
		}
		break
	}
	enc := chunk.Dst
	if fo != nil && fo.lastByte.IsZero() {
		fo.lastByte = time.Now()
	}
	if uint64(len(enc)) != total || total == 0 {
		return nil, fmt.Errorf("%w: %s: %d of %d bytes", ErrSnapshotTransfer, req.TaskId, len(enc), total)
	}
	var snap TaskSnapshot
	// enc is ours alone: the snapshot, and the operators restored from
	// it, may keep slices of it.
	elided := streamed != nil && streamed.elided
	if err := snap.unmarshalOpts(enc, true, elided); err != nil {
		if elided {
			// The operators restored off the connection came with a
			// snapshot that does not decode: fetched again whole.
			return nil, fmt.Errorf("%w: fetch snapshot of %s: %w", errStreamRestore, req.TaskId, err)
		}
		return nil, fmt.Errorf("fetch snapshot of %s: %w", req.TaskId, err)
	}
	snap.opOwned = true
	if elided {
		if streamed.early == nil || streamed.early.opSize != snap.elidedSize {
			return nil, fmt.Errorf("%w: %s: operator state of %d bytes in the snapshot not restored", errStreamRestore, req.TaskId, snap.elidedSize)
		}
		snap.early = streamed.early
		fo.interned = true
	}
	if waitEarly != nil {
		early, err := waitEarly()
		switch {
		case err != nil:
			fo.earlyErr = err
		case early != nil && early.opSize != len(snap.Operator):
			fo.earlyErr = fmt.Errorf("%w: operator state of %d bytes restored while it arrived, %d in the snapshot", ErrBadTaskSnapshot, early.opSize, len(snap.Operator))
		default:
			snap.early = early
		}
	}
	if fo != nil {
		fo.decoded = time.Now()
	}
	return &snap, nil
}
