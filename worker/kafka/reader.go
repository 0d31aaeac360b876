// Package kafka connects queries to Kafka topics with franz-go: a Reader
// consumes one partition of a topic from an exact offset (a kafka
// source task's input), and a Writer produces a sink's results in
// transactions, resuming after the last result it committed (a kafka
// sink). The package knows nothing of tasks; worker/runtime drives both.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrFetch wraps errors the broker reported for a fetch of the reader's
// partition (the reader goes on fetching: franz-go retries them).
var ErrFetch = errors.New("kafka fetch")

// Record is one consumed record.
type Record struct {
	Offset    int64
	Timestamp time.Time
	Key       []byte
	Value     []byte
}

// Start is where a Reader begins: at an exact offset, or at the
// partition's earliest or latest offset.
type Start struct {
	Earliest, Latest bool
	Offset           int64
}

// Reader consumes one partition of one topic in offset order, committed
// records only (read_committed: what a transactional producer aborted
// never shows). It joins no consumer group and commits nothing: its
// position belongs to its owner (a source task's snapshot).
type Reader struct {
	cl        *kgo.Client
	topic     string
	partition int32
}

// NewReader returns a Reader of topic's partition, starting at start.
func NewReader(brokers []string, topic string, partition int32, start Start, log *slog.Logger) (*Reader, error) {
	off := kgo.NewOffset().At(start.Offset)
	switch {
	case start.Earliest:
		off = kgo.NewOffset().AtStart()
	case start.Latest:
		off = kgo.NewOffset().AtEnd()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: off}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.WithLogger(logger{log}),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka reader for %s partition %d: %w", topic, partition, err)
	}
	return &Reader{cl: cl, topic: topic, partition: partition}, nil
}

// Poll waits for the next records (or ctx's end) and returns them in
// offset order. Errors the broker reported come back wrapped in ErrFetch
// together with whatever records arrived; the reader keeps its position.
func (r *Reader) Poll(ctx context.Context) ([]Record, error) {
	fs := r.cl.PollFetches(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var errs []error
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed) {
			errs = append(errs, err)
			return
		}
		errs = append(errs, fmt.Errorf("%w: %s partition %d: %w", ErrFetch, t, p, err))
	})
	var out []Record
	fs.EachRecord(func(rec *kgo.Record) {
		if rec.Topic != r.topic || rec.Partition != r.partition {
			return
		}
		out = append(out, Record{Offset: rec.Offset, Timestamp: rec.Timestamp, Key: rec.Key, Value: rec.Value})
	})
	return out, errors.Join(errs...)
}

// PartitionEnd asks the brokers for the end of a topic partition (its
// last stable offset: where a read_committed reader starting at "latest"
// begins). A missing topic or partition is an error wrapping ErrFetch,
// so that it is reported instead of waited for in silence (a consumer
// simply waits for it).
func PartitionEnd(ctx context.Context, brokers []string, topic string, partition int32, log *slog.Logger) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.WithLogger(logger{log}))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrFetch, topic, err)
	}
	end, ok := ends.Lookup(topic, partition)
	if !ok {
		return 0, fmt.Errorf("%w: topic %s has no partition %d (it has %d)", ErrFetch, topic, partition, len(ends[topic]))
	}
	return end.Offset, nil
}

// Close ends the reader's connections.
func (r *Reader) Close() { r.cl.Close() }

// logger bridges franz-go's logging to slog, at warnings and above (its
// info level narrates every connection).
type logger struct{ log *slog.Logger }

func (l logger) Level() kgo.LogLevel {
	if l.log == nil {
		return kgo.LogLevelNone
	}
	return kgo.LogLevelWarn
}

func (l logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		l.log.Error("kafka: "+msg, keyvals...)
	case kgo.LogLevelWarn:
		l.log.Warn("kafka: "+msg, keyvals...)
	}
}
