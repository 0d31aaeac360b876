package dataplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// MaxBatchBytes is the default bound on the encoded tuples of one Batch
// message (see WithMaxBatchBytes). Batches are what cross the wire, not
// single tuples. Each message costs both ends some microseconds of gRPC
// work whatever its size: 128 KiB batches moved 10-25 % more 100-byte
// records per second than 32 KiB ones (BENCHMARKS.md); the receiver's
// flow-control window (1 MiB) holds eight.
const MaxBatchBytes = 128<<10 - 64

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithMaxBatchBytes bounds the encoded tuples of one Batch message the
// server sends; n <= 0 means MaxBatchBytes. A batch always carries at
// least one tuple, so n = 1 sends exactly one tuple per message (the
// unbatched data plane, for measurements).
func WithMaxBatchBytes(n int) ServerOption {
	return func(s *Server) {
		if n <= 0 {
			n = MaxBatchBytes
		}
		s.maxBatch = n
	}
}

// WithCallerIdentity sets how the server learns who an incoming call is
// from: identify returns the authenticated caller's identity, ok false
// when the call is not authenticated. Acknowledgements are then accounted
// under that identity plus the subscriber name the caller gives, never
// under the name alone. The default uses the verified client certificate
// (rpc.PeerIdentity); nil turns it off.
func WithCallerIdentity(identify func(ctx context.Context) (string, bool)) ServerOption {
	return func(s *Server) { s.identity = identify }
}

// peerIdentity is the default caller identity: the org/role/name of a
// verified client certificate.
func peerIdentity(ctx context.Context) (string, bool) {
	id, ok := rpc.PeerIdentity(ctx)
	if !ok {
		return "", false
	}
	return id.String(), true
}

// maxLineErrors caps the line errors one Ingest call reports.
const maxLineErrors = 1000

// ErrUnknownStream is returned by a StreamResolver for a stream that no
// local task produces (yet); the server answers codes.NotFound.
var ErrUnknownStream = errors.New("dataplane: unknown stream")

// ErrUnknownSource is returned by an IngestHandler for a query/source that
// has no ingest task on this worker; the server answers codes.NotFound.
var ErrUnknownSource = errors.New("dataplane: unknown ingest source")

// ErrSourceClosed is returned by an IngestHandler for lines (a request
// with no lines is not refused) sent to an ingest source that was closed (IngestRequest.close); the server answers
// codes.FailedPrecondition.
var ErrSourceClosed = errors.New("dataplane: ingest source is closed")

// StreamResolver finds the output buffer a StreamRef names.
type StreamResolver interface {
	// ResolveStream returns the buffer of ref, or an error wrapping
	// ErrUnknownStream.
	ResolveStream(ref *fedstreampb.StreamRef) (*OutputBuffer, error)
}

// IngestHandler accepts the lines of one IngestRequest.
type IngestHandler interface {
	// Ingest parses lines (one JSON object each, the first numbered
	// firstLine) into the source's stream. Bad lines are reported in
	// lineErrs and do not stop the good ones; err (wrapping
	// ErrUnknownSource when the source is not here) fails the whole call.
	Ingest(ctx context.Context, query, source string, firstLine uint64, lines []byte) (accepted uint64, lineErrs []*fedstreampb.LineError, err error)
}

// IngestCloser is implemented by an IngestHandler whose sources can be
// ended (IngestRequest.close). Without it the server refuses a close with
// codes.Unimplemented.
type IngestCloser interface {
	// CloseIngest ends the source: its final boundary follows the lines
	// accepted so far, and later lines fail with ErrSourceClosed. Closing a
	// closed source succeeds. An error wrapping ErrUnknownSource means
	// the source is not here.
	CloseIngest(ctx context.Context, query, source string) error
}

// Server implements fedstreampb.DataPlaneServer on top of a StreamResolver
// and an IngestHandler.
type Server struct {
	fedstreampb.UnimplementedDataPlaneServer
	resolver StreamResolver
	ingest   IngestHandler
	log      *slog.Logger
	maxBatch int
	// identity authenticates callers for acknowledgement accounting (see
	// WithCallerIdentity).
	identity func(ctx context.Context) (string, bool)
}

// NewServer returns a DataPlane server. ingest may be nil (Ingest then
// answers Unimplemented); logger nil means slog.Default().
func NewServer(resolver StreamResolver, ingest IngestHandler, logger *slog.Logger, opts ...ServerOption) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{resolver: resolver, ingest: ingest, log: logger, maxBatch: MaxBatchBytes, identity: peerIdentity}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Subscribe serves one subscription: the first request names the stream,
// the resume point and the subscriber; later requests carry cumulative
// acknowledgements, processed concurrently with sending. An ack-only
// subscription (a downstream replica relaying its progress to an upstream
// replica it does not read from) gets no data; its acknowledgements are
// clamped to the buffer's last id. On a data subscription an
// acknowledgement beyond the last id sent on it is refused: the
// subscription ends with InvalidArgument and the ack is not applied.
//
// Acknowledgements are accounted under the subscriber's key (see
// WithCallerIdentity); the subscriber holds the buffer while any of its
// subscriptions is live and for the buffer's lease after the last ends.
func (s *Server) Subscribe(stream fedstreampb.DataPlane_SubscribeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ref := first.GetStream()
	if ref == nil {
		return status.Error(codes.InvalidArgument, "the first SubscribeRequest must name a stream")
	}
	if first.NoAck && first.AckOnly {
		return status.Error(codes.InvalidArgument, "a subscription cannot be both no_ack and ack_only")
	}
	if !first.NoAck && first.Subscriber == "" {
		return status.Error(codes.InvalidArgument, "an acknowledging subscription must name its subscriber")
	}
	if !first.NoAck && !first.AckOnly && first.AckId > 0 {
		return status.Errorf(codes.InvalidArgument, "ack %d in the first request of a data subscription: nothing was sent on it yet", first.AckId)
	}
	buf, err := s.resolver.ResolveStream(ref)
	if err != nil {
		if errors.Is(err, ErrUnknownStream) {
			return status.Error(codes.NotFound, err.Error())
		}
		return status.Error(codes.Internal, err.Error())
	}
	ctx := stream.Context()
	key := s.subscriberKey(ctx, first.Subscriber)
	if first.Leave {
		if first.Subscriber == "" {
			return status.Error(codes.InvalidArgument, "a leave must name its subscriber")
		}
		buf.Forget(key)
		return nil
	}
	// The handshake's other half: this build's data-plane level, sent
	// with the first message (older subscribers ignore the header).
	if err := stream.SetHeader(metadata.Pairs(rpc.DataPlaneLevelHeader, strconv.Itoa(int(rpc.DataPlaneLevel)))); err != nil {
		return err
	}
	if buf.Restarted() {
		// Sent now: the reader may be waiting for an id this copy has
		// not produced yet (rpc.StreamRestartedHeader).
		if err := stream.SendHeader(metadata.Pairs(rpc.StreamRestartedHeader, "1")); err != nil {
			return err
		}
	}
	if !first.NoAck {
		buf.Connect(key)
		defer buf.Disconnect(key)
	}
	if first.AckOnly {
		return s.relayed(stream, buf, key, first)
	}
	if !first.NoAck {
		// Before anything is read: a stream waiting for its consumer's
		// position continues after it (RenumberOnFirstResume).
		buf.resumeFirst(first.AfterId)
	}
	if !first.NoAck && first.AfterId > 0 {
		// A consumer resuming: it holds the stream up to AfterId (a
		// restarted source catches up to it, Wanted).
		buf.NoteHeld(first.AfterId)
	}
	log := s.log.With("query", ref.Query, "task", ref.TaskId, "partition", ref.Partition, "consumer", ref.Consumer, "subscriber", key)

	// sent is the last id sent on this subscription: acknowledgements may
	// not go beyond it. It is raised before each Send, since the client
	// may acknowledge as soon as the batch arrives.
	var sent atomic.Uint64
	// The ack reader ends when the stream does: gRPC fails Recv once this
	// handler has returned. An acknowledging subscriber half-closes after
	// its last acknowledgement: the reader then reports nil and the
	// handler ends the stream, which tells the subscriber that every
	// acknowledgement arrived. A half-closed tail client keeps receiving.
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				if err != io.EOF {
					recvErr <- err
				} else if !first.NoAck {
					recvErr <- nil
				}
				return
			}
			if first.NoAck || req.AckId == 0 {
				continue
			}
			if top := sent.Load(); req.AckId > top {
				log.Warn("subscriber acknowledged tuples it was not sent; subscription refused", "ack_id", req.AckId, "last_sent", top)
				recvErr <- status.Errorf(codes.InvalidArgument, "ack %d is beyond the last id sent on this subscription (%d): refused", req.AckId, top)
				return
			}
			buf.Ack(key, req.AckId)
		}
	}()

	after := first.AfterId
	if first.ResumeStable {
		after = buf.ResumePosition(after)
	}
	// start is where the subscription reads from: AfterId, or before it
	// when it resumes by stable id into a tentative tail (ResumePosition).
	start := after
	warnedGap := false
	namedSent := false // the first data batch carries the stream's named ranges
	for {
		if !first.NoAck && (buf.endedBefore(first.AfterId) || buf.endDiscardedAfter(after)) {
			// Resumed at or past this replica's end (see
			// ErrEndedBefore), or below an end already discarded;
			// checked again after every wake-up, since the end may come
			// while the subscription waits.
			if buf.endedBefore(first.AfterId) {
				log.Warn("subscriber resumes at or past the end of this replica's stream; told so", "after_id", first.AfterId)
			} else {
				log.Warn("subscriber reads before this replica's end, which was discarded (acknowledged): it can never get it; told the stream ended", "after_id", after)
			}
			return status.Errorf(codes.OutOfRange, "stream %s/%s[%d]->%q: %v (after %d)", ref.Query, ref.TaskId, ref.Partition, ref.Consumer, ErrEndedBefore, first.AfterId)
		}
		data, count, last, gap, wait, err := buf.Read(after, s.maxBatch)
		if err != nil {
			return status.Errorf(codes.Unavailable, "stream %s/%s[%d]->%q ended: %v", ref.Query, ref.TaskId, ref.Partition, ref.Consumer, err)
		}
		if gap && !first.NoAck && !warnedGap && (after != start || buf.DiscardedStableAfter(after)) {
			// Before anything was sent, only a discarded result is a
			// loss: a DCAA subscriber resumes by stable id, which may lie
			// below positions it took here itself before it switched
			// away (DiscardedStableAfter). Once something was sent,
			// after is a position of this stream.
			log.Warn("subscriber resumes after discarded tuples; it misses some", "after_id", after)
			warnedGap = true
		}
		if count == 0 {
			if !first.NoAck && after == start && after > 0 {
				// Nothing sent yet, and this replica has nothing after
				// the subscriber's position: it is behind the replica
				// the subscriber read before. The subscriber has
				// everything up to AfterId, which is its acknowledgement
				// here too (clamped to what this replica produced), or
				// a full buffer would wait forever for an ack of tuples
				// it never sends. By stable id of another lineage
				// (tag), it holds what it holds by stream time instead
				// (TaggedPosition): taken as a position, the id
				// discarded a restarted copy's first results before
				// this subscriber realigned onto them.
				ack := after
				if tag := tagOf(first); first.ResumeStable && tag.Known {
					if p, same := buf.TaggedPosition(tag); !same {
						ack = p
					}
				}
				buf.Ack(key, ack)
			}
			var hb <-chan time.Time
			stop := func() bool { return false }
			if !first.NoAck {
				hb, stop = heartbeatTimer(buf)
			}
			select {
			case <-wait:
			case <-hb:
				// Nothing to send for a heartbeat interval: say so, with
				// the state, so the subscriber knows this replica lives.
				st, wm := buf.stateUpTo(after)
				lin, since := buf.Lineage()
				if err := stream.Send(&fedstreampb.Batch{LastId: after, ReplicaState: st, TentativeWatermark: wm,
					Lineage: lin, LineageSince: since}); err != nil {
					return err
				}
			case <-ctx.Done():
				stop()
				return ctx.Err()
			case err := <-recvErr:
				stop()
				return err
			}
			stop()
			continue
		}
		select {
		case err := <-recvErr:
			return err
		default:
		}
		if first.DataplaneLevel < rpc.DataPlaneLevel {
			// An older subscriber gets no tuple type it does not know
			// (compat.go).
			var replaced int
			if data, replaced, err = downgradeForLevel(data, first.DataplaneLevel); err != nil {
				return status.Error(codes.Internal, err.Error())
			}
			if replaced > 0 {
				log.Warn("subscriber of an older build: UNCORRECTABLE records sent as REC_DONE (the producing task's status names the ranges)",
					"subscriber_level", rpc.DataPlaneLevelText(first.DataplaneLevel), "records", replaced, "last_id", last)
			}
		}
		sent.Store(last)
		st, wm := buf.stateUpTo(last)
		lin, since := buf.Lineage()
		var named []int64
		if !namedSent {
			namedSent = true
			named = flattenRanges(buf.NamedRanges())
		}
		if err := stream.Send(&fedstreampb.Batch{Data: data, Count: uint32(count), LastId: last, ReplicaState: st, TentativeWatermark: wm,
			PositionOffset: buf.PositionOffset(last), Lineage: lin, LineageSince: since, NamedRanges: named}); err != nil {
			return err
		}
		after = last
	}
}

// relayed serves an ack-only subscription: it applies the subscriber's
// acknowledgements (the buffer clamps them to its last id) until the
// subscriber half-closes (nil) or goes away. Stable ids (first.AckStable)
// tagged with their lineage are taken by TaggedPosition.
func (s *Server) relayed(stream fedstreampb.DataPlane_SubscribeServer, buf *OutputBuffer, key string, first *fedstreampb.SubscribeRequest) error {
	stable := first.AckStable
	apply := func(a relayedAck) {
		id := buf.relayedPosition(stable, a.id, a.tag)
		buf.NoteHeld(id) // the subscriber took it from a peer replica
		buf.Ack(key, id)
	}
	// last is the latest acknowledgement, applied again every
	// relayRefresh: clamped to what this replica had produced when it
	// came (a replica behind the one the subscriber reads), it takes the
	// rest as this replica catches up, without the subscriber repeating
	// it over the network (see relayRepeat).
	last := relayedAck{first.AckId, tagOf(first)}
	if last.id > 0 || last.tag.Known {
		apply(last)
	}
	refresh := time.NewTicker(relayRefresh)
	defer refresh.Stop()
	// Recv fails once this handler has returned, which ends the reader.
	acks := make(chan relayedAck)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				recvErr <- err
				return
			}
			select {
			case acks <- relayedAck{req.AckId, tagOf(req)}:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case a := <-acks:
			if a.id > 0 || a.tag.Known {
				last = a
				apply(a)
			}
		case <-refresh.C:
			if last.id > 0 || last.tag.Known {
				apply(last)
			}
		case err := <-recvErr:
			return err
		case <-buf.Done():
			return status.Error(codes.Unavailable, "stream ended: its producer stopped")
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// relayedAck is one acknowledgement of an ack-only subscription: its
// ack_id and, from a consumer of this build, its tag.
type relayedAck struct {
	id  uint64
	tag StableTag
}

// subscriberKey is the name acknowledgements are accounted under. When the
// caller is authenticated it is the caller's identity followed by the name
// it gave, so a client can only ever speak for itself; otherwise
// (plaintext) the name alone.
func (s *Server) subscriberKey(ctx context.Context, name string) string {
	if s.identity != nil {
		if id, ok := s.identity(ctx); ok {
			return id + "/" + name
		}
	}
	return name
}

// Ingest hands each request's lines to the IngestHandler and answers, once
// the client has sent everything, with the totals.
func (s *Server) Ingest(stream fedstreampb.DataPlane_IngestServer) error {
	if s.ingest == nil {
		return status.Error(codes.Unimplemented, "this worker does not accept ingest")
	}
	var query, source string
	resp := &fedstreampb.IngestResponse{}
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(resp)
		}
		if err != nil {
			return err
		}
		if query == "" {
			query, source = req.Query, req.Source
			if query == "" || source == "" {
				return status.Error(codes.InvalidArgument, "the first IngestRequest must name query and source")
			}
		}
		accepted, lineErrs, err := s.ingest.Ingest(stream.Context(), query, source, req.FirstLine, req.Lines)
		if err != nil {
			return ingestStatus(err)
		}
		resp.Accepted += accepted
		if room := maxLineErrors - len(resp.Errors); room > 0 {
			resp.Errors = append(resp.Errors, lineErrs[:min(room, len(lineErrs))]...)
		}
		if req.Close {
			closer, ok := s.ingest.(IngestCloser)
			if !ok {
				return status.Error(codes.Unimplemented, "this worker cannot close ingest sources")
			}
			if err := closer.CloseIngest(stream.Context(), query, source); err != nil {
				return ingestStatus(err)
			}
			resp.Closed = true
		}
	}
}

// ingestStatus turns an IngestHandler's error into the call's status.
func ingestStatus(err error) error {
	switch {
	case errors.Is(err, ErrUnknownSource):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrSourceClosed):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrSourceMoved):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, ErrIngestGap):
		return status.Error(codes.OutOfRange, err.Error())
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}
