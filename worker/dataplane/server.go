package dataplane

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// maxLineErrors caps the line errors one Ingest call reports.
const maxLineErrors = 1000

// ErrUnknownStream is returned by a StreamResolver for a stream that no
// local task produces (yet); the server answers codes.NotFound.
var ErrUnknownStream = errors.New("dataplane: unknown stream")

// ErrUnknownSource is returned by an IngestHandler for a query/source that
// has no ingest task on this worker; the server answers codes.NotFound.
var ErrUnknownSource = errors.New("dataplane: unknown ingest source")

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

// Server implements fedstreampb.DataPlaneServer on top of a StreamResolver
// and an IngestHandler.
type Server struct {
	fedstreampb.UnimplementedDataPlaneServer
	resolver StreamResolver
	ingest   IngestHandler
	log      *slog.Logger
	maxBatch int
}

// NewServer returns a DataPlane server. ingest may be nil (Ingest then
// answers Unimplemented); logger nil means slog.Default().
func NewServer(resolver StreamResolver, ingest IngestHandler, logger *slog.Logger, opts ...ServerOption) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{resolver: resolver, ingest: ingest, log: logger, maxBatch: MaxBatchBytes}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Subscribe serves one subscription: the first request names the stream,
// the resume point and the subscriber; later requests carry cumulative
// acknowledgements, processed concurrently with sending.
func (s *Server) Subscribe(stream fedstreampb.DataPlane_SubscribeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ref := first.GetStream()
	if ref == nil {
		return status.Error(codes.InvalidArgument, "the first SubscribeRequest must name a stream")
	}
	if !first.NoAck && first.Subscriber == "" {
		return status.Error(codes.InvalidArgument, "an acknowledging subscription must name its subscriber")
	}
	buf, err := s.resolver.ResolveStream(ref)
	if err != nil {
		if errors.Is(err, ErrUnknownStream) {
			return status.Error(codes.NotFound, err.Error())
		}
		return status.Error(codes.Internal, err.Error())
	}
	if !first.NoAck {
		buf.Register(first.Subscriber)
		if first.AckId > 0 {
			buf.Ack(first.Subscriber, first.AckId)
		}
	}
	ctx := stream.Context()
	log := s.log.With("query", ref.Query, "task", ref.TaskId, "partition", ref.Partition, "consumer", ref.Consumer, "subscriber", first.Subscriber)

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
			if !first.NoAck && req.AckId > 0 {
				buf.Ack(first.Subscriber, req.AckId)
			}
		}
	}()

	after := first.AfterId
	warnedGap := false
	for {
		data, count, last, gap, wait, err := buf.Read(after, s.maxBatch)
		if err != nil {
			return status.Errorf(codes.Unavailable, "stream %s/%s[%d]->%q ended: %v", ref.Query, ref.TaskId, ref.Partition, ref.Consumer, err)
		}
		if gap && !first.NoAck && !warnedGap {
			log.Warn("subscriber resumes after discarded tuples; it misses some", "after_id", after)
			warnedGap = true
		}
		if count == 0 {
			select {
			case <-wait:
			case <-ctx.Done():
				return ctx.Err()
			case err := <-recvErr:
				return err
			}
			continue
		}
		select {
		case err := <-recvErr:
			return err
		default:
		}
		if err := stream.Send(&fedstreampb.Batch{Data: data, Count: uint32(count), LastId: last}); err != nil {
			return err
		}
		after = last
	}
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
			if errors.Is(err, ErrUnknownSource) {
				return status.Error(codes.NotFound, err.Error())
			}
			if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
				return err
			}
			return status.Error(codes.Internal, err.Error())
		}
		resp.Accepted += accepted
		if room := maxLineErrors - len(resp.Errors); room > 0 {
			resp.Errors = append(resp.Errors, lineErrs[:min(room, len(lineErrs))]...)
		}
	}
}
