package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Record headers a Writer puts on every record: whose result it is, of
// which run of the query, and its result id. Reading them back is how a
// Writer finds where it stopped.
const (
	HeaderSink = "fedstream-sink"
	HeaderRun  = "fedstream-run"
	HeaderID   = "fedstream-id"
)

// endTimeout bounds ending (committing or aborting) one transaction.
const endTimeout = 10 * time.Second

// ErrReadBack means a Writer could not find the last result it committed
// (the topic's tail could not be read to its end); nothing is written
// until it can.
var ErrReadBack = errors.New("kafka sink: cannot read back the last committed result")

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers []string
	Topic   string
	// TransactionalID is shared by every copy of one sink: a copy that
	// opens fences every older one (Kafka aborts their open transaction
	// and refuses their later ones), so one copy writes at a time.
	TransactionalID string
	// Sink names the sink (header fedstream-sink), Run the query's run
	// (header fedstream-run): result ids count from 1 again in a new run.
	Sink string
	Run  uint64
	Log  *slog.Logger
	// ReadBackTimeout bounds reading the topic's tail on Open (default 30s).
	ReadBackTimeout time.Duration
}

// Out is one result to write: its id in the sink's result stream, the
// record key (nil: none) and value.
type Out struct {
	ID         uint64
	Key, Value []byte
}

// Writer writes a sink's results to a topic, each batch in one Kafka
// transaction, so a batch is all visible or not at all (to read_committed
// consumers). Used by one goroutine.
type Writer struct {
	cfg WriterConfig
	cl  *kgo.Client
	run []byte
}

// NewWriter returns a Writer; Open connects it.
func NewWriter(cfg WriterConfig) *Writer {
	if cfg.ReadBackTimeout <= 0 {
		cfg.ReadBackTimeout = 30 * time.Second
	}
	return &Writer{cfg: cfg, run: []byte(strconv.FormatUint(cfg.Run, 10))}
}

// Open (re)connects: it first takes over the transactional id, which
// fences any other copy of the sink and ends its open transaction, and
// then reads back the id of the last result committed to the topic by
// this sink in this run (0 when none). Results up to it are written;
// the caller writes what follows. Open after any failed Write: the
// outcome of a transaction whose commit failed is only known from the
// topic.
func (w *Writer) Open(ctx context.Context) (last uint64, err error) {
	w.Close()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(w.cfg.Brokers...),
		kgo.TransactionalID(w.cfg.TransactionalID),
		kgo.DefaultProduceTopic(w.cfg.Topic),
		kgo.WithLogger(logger{w.cfg.Log}),
	)
	if err != nil {
		return 0, fmt.Errorf("kafka sink %s: %w", w.cfg.Sink, err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return 0, fmt.Errorf("kafka sink %s: take over transactional id %q: %w", w.cfg.Sink, w.cfg.TransactionalID, err)
	}
	w.cl = cl
	rctx, cancel := context.WithTimeout(ctx, w.cfg.ReadBackTimeout)
	defer cancel()
	last, err = w.lastCommitted(rctx)
	if err != nil {
		w.Close()
		return 0, err
	}
	return last, nil
}

// Write writes outs in one transaction and returns once it is committed.
// On error the transaction may or may not have committed: Open again.
func (w *Writer) Write(ctx context.Context, outs []Out) error {
	if w.cl == nil {
		return fmt.Errorf("kafka sink %s: writer not open", w.cfg.Sink)
	}
	if len(outs) == 0 {
		return nil
	}
	if err := w.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("kafka sink %s: begin transaction: %w", w.cfg.Sink, err)
	}
	recs := make([]*kgo.Record, len(outs))
	sink := []byte(w.cfg.Sink)
	for i, o := range outs {
		recs[i] = &kgo.Record{Key: o.Key, Value: o.Value, Headers: []kgo.RecordHeader{
			{Key: HeaderSink, Value: sink},
			{Key: HeaderRun, Value: w.run},
			{Key: HeaderID, Value: strconv.AppendUint(nil, o.ID, 10)},
		}}
	}
	// Ending a transaction is not cancelled with ctx (a cancelled commit
	// leaves its outcome unknown; the next Open finds it out either way),
	// but bounded, so that a stopping task does not wait on a dead broker.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if err := w.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		_ = w.cl.EndTransaction(ectx, kgo.TryAbort)
		return fmt.Errorf("kafka sink %s: produce: %w", w.cfg.Sink, err)
	}
	if err := w.cl.EndTransaction(ectx, kgo.TryCommit); err != nil {
		return fmt.Errorf("kafka sink %s: commit: %w", w.cfg.Sink, err)
	}
	return nil
}

// Close releases the connections (an open transaction is left to be
// aborted by the next Open or Kafka's transaction timeout).
func (w *Writer) Close() {
	if w.cl != nil {
		w.cl.Close()
		w.cl = nil
	}
}

// lastCommitted finds the largest result id committed by this sink in
// this run, over every partition of the topic. Transactions commit a
// batch on all partitions at once and in order, so every result up to it
// is committed and none after it.
func (w *Writer) lastCommitted(ctx context.Context) (uint64, error) {
	adm := kadm.NewClient(w.cl)
	ends, err := adm.ListCommittedOffsets(ctx, w.cfg.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("%w: list end offsets of %s: %w", ErrReadBack, w.cfg.Topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, w.cfg.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("%w: list start offsets of %s: %w", ErrReadBack, w.cfg.Topic, err)
	}
	if len(ends[w.cfg.Topic]) == 0 {
		return 0, fmt.Errorf("%w: topic %s has no partitions (does it exist?)", ErrReadBack, w.cfg.Topic)
	}
	var last uint64
	for p, end := range ends[w.cfg.Topic] {
		start, _ := starts.Lookup(w.cfg.Topic, p)
		id, err := w.lastInPartition(ctx, p, max(start.Offset, 0), end.Offset)
		if err != nil {
			return 0, err
		}
		last = max(last, id)
	}
	return last, nil
}

// lastInPartition reads partition p backwards in growing windows ending
// at end (its last stable offset) until it meets a record of this sink:
// the last of this run's records gives the id; a record of the sink from
// an earlier run means this run wrote nothing there (runs write one after
// another: a new run's writer fences the old one).
func (w *Writer) lastInPartition(ctx context.Context, p int32, start, end int64) (uint64, error) {
	for window := int64(256); ; window *= 4 {
		lo := max(start, end-window)
		if lo >= end {
			return 0, nil
		}
		id, mine, sinkSeen, err := w.scan(ctx, p, lo, end)
		if err != nil {
			return 0, err
		}
		if mine || sinkSeen || lo == start {
			return id, nil
		}
	}
}

// scan reads offsets lo..end-1 of partition p, committed records and
// transaction markers (so that it knows when it has reached end-1, which
// is a marker after a transaction).
func (w *Writer) scan(ctx context.Context, p int32, lo, end int64) (id uint64, mine, sinkSeen bool, err error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(w.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{w.cfg.Topic: {p: kgo.NewOffset().At(lo)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.WithLogger(logger{w.cfg.Log}),
	)
	if err != nil {
		return 0, false, false, fmt.Errorf("%w: %w", ErrReadBack, err)
	}
	defer cl.Close()
	sink := w.cfg.Sink
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, false, false, fmt.Errorf("%w: %s partition %d offsets %d..%d: %w", ErrReadBack, w.cfg.Topic, p, lo, end-1, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return 0, false, false, fmt.Errorf("%w: %s partition %d: %w", ErrReadBack, w.cfg.Topic, p, ferr)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end {
				done = true
				return
			}
			if r.Offset == end-1 {
				done = true
			}
			if r.Attrs.IsControl() {
				return
			}
			var rs, rr, ri []byte
			hasSink := false
			for _, h := range r.Headers {
				switch h.Key {
				case HeaderSink:
					rs, hasSink = h.Value, true
				case HeaderRun:
					rr = h.Value
				case HeaderID:
					ri = h.Value
				}
			}
			if !hasSink || string(rs) != sink {
				return
			}
			sinkSeen = true
			if string(rr) != string(w.run) {
				return
			}
			n, perr := strconv.ParseUint(string(ri), 10, 64)
			if perr != nil {
				return
			}
			mine = true
			id = max(id, n)
		})
		if done {
			return id, mine, sinkSeen, nil
		}
	}
}
