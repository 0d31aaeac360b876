package dataplane

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Resumable ingest (issue 9 item 3): a producer's lines carry offsets
// (IngestRequest.first_line, consecutive over the producer's session),
// each source copy records in its state the last offset it took from
// each producer, and every request is acknowledged with that offset. A
// producer whose stream to a copy ends or fails asks where the source
// runs now and resends from its last acknowledged offset; the copy skips
// what it already took. So a source can move (or its stream break)
// without a line lost or taken twice.

// ErrSourceMoved is returned by an IngestHandler for lines sent to a copy
// of an ingest source that was snapshotted to move: it takes nothing
// more, the client must send to where the source runs now (the server
// answers codes.Unavailable).
var ErrSourceMoved = errors.New("dataplane: ingest source moved to another worker")

// ErrIngestGap is returned by a SessionIngestHandler for lines that start
// after the next offset the source copy expects from their producer: the
// lines between are missing (the server answers codes.OutOfRange).
var ErrIngestGap = errors.New("dataplane: ingest offsets leave a gap")

// SessionIngestHandler is implemented by an IngestHandler that tracks
// producers (IngestSession).
type SessionIngestHandler interface {
	// IngestFrom takes the lines of one request of producer (the first
	// numbered firstLine; lines at or below the producer's acknowledged
	// offset are skipped), then closes the source when close is set, and
	// answers with this request's accepted lines and errors and the
	// producer's acknowledged offset. lines may be empty (a handshake:
	// the answer tells where the producer stands).
	IngestFrom(ctx context.Context, query, source, producer string, firstLine uint64, lines []byte, close bool) (*fedstreampb.IngestResponse, error)
}

// IngestSession is Ingest with per-request acknowledgements: the first
// request names query, source and producer; every request is answered,
// in order, with an IngestResponse carrying the producer's acknowledged
// offset.
func (s *Server) IngestSession(stream fedstreampb.DataPlane_IngestSessionServer) error {
	h, ok := s.ingest.(SessionIngestHandler)
	if !ok {
		return status.Error(codes.Unimplemented, "this worker does not accept resumable ingest")
	}
	var query, source, producer string
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if query == "" {
			query, source, producer = req.Query, req.Source, req.Producer
			if query == "" || source == "" || producer == "" {
				return status.Error(codes.InvalidArgument, "the first IngestRequest of a session must name query, source and producer")
			}
		}
		resp, err := h.IngestFrom(stream.Context(), query, source, producer, req.FirstLine, req.Lines, req.Close)
		if err != nil {
			return ingestStatus(err)
		}
		if len(resp.Errors) > maxLineErrors {
			resp.Errors = resp.Errors[:maxLineErrors]
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
