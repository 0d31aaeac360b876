package runtime

// Kafka sources and sinks (see docs/QUERY.md, "Kafka").
//
// A kafka source task reads one Kafka partition (source partition i reads
// Kafka partition i) in offset order. Its stream is a function of the
// partition's contents: each record becomes a tuple, and BOUNDARY tuples
// follow stime exactly as a generator's do, so every replica produces the
// same tuples with the same ids. Its position is the offset of the next
// record: a snapshot carries it (TaskSnapshot.SourceRecords), taken by
// the source goroutine between two polled batches like a generator's,
// and a copy started from the snapshot reads from there.
//
// A kafka sink task of replica 0 writes the results of its result stream
// to the topic, each group of results in one Kafka transaction, from a
// goroutine that follows the stream and acknowledges what Kafka committed
// (see kafkaSinkBuffer). All copies of a sink share one transactional id:
// a copy that starts fences the older ones and then reads back the last
// result id committed, so it writes exactly the results after it.
//
// In a replicated query (DCAA) the writer writes stable results only:
// tentative results, UNDO and REC_DONE never reach the topic, so the topic
// holds exactly a failure-free run's results, once each, later when a
// failure makes them wait for corrections. A result's id in Kafka is its
// stable id (the count of stable results and boundaries up to it; its
// position in a query without replicas).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/kafka"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// kafkaSource is the state of a kafka source task (source goroutine only).
type kafkaSource struct {
	cfg    *queryspec.KafkaSource
	start  kafka.Start
	parser *source.LineParser
	// hasTime: the schema has a timestamp field, which gives the stime;
	// otherwise the Kafka record's timestamp does.
	hasTime bool
	tp      tuple.Tuple
	// bad counts records skipped because their value does not fit the
	// schema.
	bad uint64
}

func newKafkaSource(t *task) (*kafkaSource, error) {
	cfg := t.node.Source.Kafka
	earliest, latest, off, err := queryspec.KafkaStartOffset(cfg.Start)
	if err != nil {
		return nil, err
	}
	schema := t.node.HeadSchema()
	ks := &kafkaSource{cfg: cfg, start: kafka.Start{Earliest: earliest, Latest: latest, Offset: off}, parser: source.NewLineParser(schema)}
	for _, f := range schema.Fields {
		if f.Kind == tuple.KindTimestamp {
			ks.hasTime = true
		}
	}
	return ks, nil
}

// kafkaPoll is what the poll goroutine hands the source goroutine:
// records, an error to report, where a "latest" start resolved to, or a
// fatal error.
type kafkaPoll struct {
	recs    []kafka.Record
	err     error
	startAt *int64
	// replayTo (a copy placed again, see replayIdle): where the
	// partition ended when the copy started.
	replayTo *int64
	fatal    error
}

// runKafka drives a kafka source task until it stops.
func (t *task) runKafka() {
	defer close(t.genDone)
	ctx := t.ctx
	ks := t.kafka
	interval := int64(t.r.opts.BoundaryInterval)
	boundary, next := int64(math.MinInt64), int64(math.MinInt64)
	start := ks.start
	// resolved: t.genRecords is the offset of the next record to read,
	// which a snapshot carries. A "latest" start is resolved by asking the
	// brokers first: a snapshot taken before any record arrived must name
	// that offset, not the partition's beginning.
	resolved := !start.Latest
	switch r := t.genRestore; {
	case r != nil:
		// Started from a snapshot: read from the next offset it had not
		// read, with the boundary it had emitted.
		start, resolved = kafka.Start{Offset: r.records}, true
		t.genRecords, boundary = r.records, r.boundary
		if boundary != math.MinInt64 {
			if next = boundary + interval; next < boundary {
				next = math.MaxInt64
			}
		}
	case !start.Earliest && !start.Latest:
		t.genRecords = start.Offset
	}
	// One goroutine polls; this one emits and answers snapshot requests
	// between two polled batches.
	polls := make(chan kafkaPoll)
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	send := func(p kafkaPoll) bool {
		select {
		case polls <- p:
			return true
		case <-pctx.Done():
			return false
		}
	}
	findLatest := !resolved // read by the poll goroutine only
	// A copy placed again without a snapshot reads the partition again
	// from its start: see replayIdle.
	replay := newKafkaReplay(t)
	wg.Add(1)
	go func() {
		defer wg.Done()
		topic, part := ks.cfg.Topic, int32(t.spec.Partition)
		// A missing topic or partition is said (and checked again) rather
		// than waited for in silence.
		for {
			end, err := kafka.PartitionEnd(pctx, ks.cfg.Brokers, topic, part, t.log)
			if pctx.Err() != nil {
				return
			}
			if err == nil {
				if findLatest {
					start = kafka.Start{Offset: end}
					if !send(kafkaPoll{startAt: &end}) {
						return
					}
				}
				if replay != nil && !send(kafkaPoll{replayTo: &end}) {
					return
				}
				break
			}
			if !send(kafkaPoll{err: err}) || !sleepCtx(pctx, 2*time.Second) {
				return
			}
		}
		reader, err := kafka.NewReader(ks.cfg.Brokers, topic, part, start, t.log)
		if err != nil {
			send(kafkaPoll{fatal: err})
			return
		}
		defer reader.Close()
		for pctx.Err() == nil {
			recs, err := reader.Poll(pctx)
			if len(recs) == 0 && err == nil {
				continue
			}
			if !send(kafkaPoll{recs: recs, err: err}) {
				return
			}
		}
	}()
	var (
		lastWarn time.Time
		noted    bool // the task's message says fetching fails
		// polled: records came since the last tick (an idle source
		// switches to a reconfiguration plan on its own, see idleSwitch).
		polled bool
	)
	tick := time.NewTicker(t.r.opts.BoundaryInterval)
	defer tick.Stop()
	for {
		var p kafkaPoll
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			idle := !polled
			polled = false
			if t.rc.pending.Load() == nil {
				continue // the query was never reconfigured
			}
			if err := t.pollReconfig(); err != nil {
				t.fail(err)
				return
			}
			if at := max(boundary, t.maxSTime, math.MinInt64+1); idle && resolved && !replay.holds(t) {
				// The marker goes above every stime sent; a record
				// behind it later is counted at it, as any late record.
				switched, err := t.idleSwitch(ctx, at)
				if err != nil {
					t.endWith(err)
					return
				}
				if switched {
					t.rc.replay.sentUpTo(at)
					boundary = at
					if next = boundary + interval; next < boundary {
						next = math.MaxInt64
					}
				}
			}
			continue
		case req := <-t.genSnap:
			if !resolved {
				req <- sourceCut{err: fmt.Errorf("%w: kafka source %s has not found its start offset yet", ErrNotSnapshottable, t.spec.TaskID)}
				continue
			}
			req <- t.cutSource(ctx, boundary)
			continue
		case p = <-polls:
		}
		switch {
		case p.fatal != nil:
			t.fail(p.fatal)
			return
		case p.startAt != nil:
			t.genRecords, resolved = *p.startAt, true
			continue
		case p.replayTo != nil:
			replay.to, replay.known = *p.replayTo, true
			continue
		}
		if p.err != nil && ctx.Err() == nil && time.Since(lastWarn) > 10*time.Second {
			// franz-go keeps retrying; say so at most every 10s.
			lastWarn = time.Now()
			t.log.Warn("kafka source: fetch failed; retrying", "err", p.err)
			t.noteWhileRunning(fmt.Sprintf("%v (retrying)", p.err))
			noted = true
		}
		if p.err == nil && noted {
			noted = false
			t.noteWhileRunning("")
		}
		polled = polled || len(p.recs) > 0
		for _, rec := range p.recs {
			if rec.Offset < t.genRecords {
				continue // read already (never twice)
			}
			tp := &ks.tp
			if err := ks.parser.Parse(uint64(rec.Offset), rec.Value, tp); err != nil {
				ks.badRecord(t, rec.Offset, err)
				t.genRecords = rec.Offset + 1
				continue
			}
			if !ks.hasTime {
				tp.STime = rec.Timestamp.UnixNano()
			}
			if t.rc.replay != nil {
				// Placed again: an earlier copy's early marker below
				// this record goes first (reconfig_replay.go).
				b, err := t.replayMarksBelow(ctx, boundary, tp.STime)
				if err != nil {
					t.endWith(err)
					return
				}
				if b != boundary {
					boundary = b
					if next = boundary + interval; next < boundary {
						next = math.MaxInt64
					}
				}
			}
			if tp.STime < boundary {
				// Behind time already promised downstream: counted at
				// the boundary, deterministically (as a generator does).
				tp.STime = boundary
			}
			if tp.STime >= next {
				if b := floorDiv(tp.STime, interval) * interval; b > boundary {
					if err := t.holdForCut(ctx, boundary, b); err != nil {
						t.endWith(err)
						return
					}
					if err := t.emitBoundary(ctx, b); err != nil {
						t.endWith(err)
						return
					}
					boundary = b
				}
				if next = boundary + interval; next < boundary {
					next = math.MaxInt64
				}
			}
			tp.Type = tuple.Stable
			if err := t.holdForCut(ctx, boundary, tp.STime); err != nil {
				t.endWith(err)
				return
			}
			t.emitSource(ctx, tp)
			if t.emitErr != nil {
				t.endWith(t.emitErr)
				return
			}
			t.genRecords = rec.Offset + 1
		}
		if err := t.flush(ctx); err != nil {
			t.endWith(err)
			return
		}
	}
}

// badRecord counts a record whose value does not fit the schema (skipped
// the same way on every replica) and logs the first and every 10 000th.
func (ks *kafkaSource) badRecord(t *task, offset int64, err error) {
	ks.bad++
	var le *source.LineError
	msg := err.Error()
	if errors.As(err, &le) {
		msg = le.Msg
		if le.Field != "" {
			msg = fmt.Sprintf("field %q: %s", le.Field, le.Msg)
		}
	}
	msg = fmt.Sprintf("kafka %s partition %d offset %d: %s", ks.cfg.Topic, t.spec.Partition, offset, msg)
	if ks.bad == 1 || ks.bad%10000 == 0 {
		t.log.Warn("kafka source: record skipped", "reason", msg, "skipped", ks.bad)
	}
	t.noteWhileRunning(fmt.Sprintf("kafka records skipped (value does not fit the schema): %d; last: %s", ks.bad, msg))
}

// kafkaSink writes a sink task's results to Kafka (replica 0 only).
type kafkaSink struct {
	w      *kafka.Writer
	schema *tuple.Schema
	keyIdx []int
	// written is the id of the last result committed to Kafka (writer
	// goroutine; read by tests).
	written atomic.Uint64
	// writes counts committed transactions; gaps the times the stream
	// lacked ids not yet committed (see runKafkaSink).
	writes, gaps atomic.Uint64
	// uncorrectable counts the UNCORRECTABLE records the result stream
	// carried (DCAA: results written as a replay past its bound made
	// them; see dcaa_uncorrectable.go). They are logged, not written:
	// the topic holds results only.
	uncorrectable atomic.Uint64
	// restoredAt is, for a copy started from a snapshot of the writing
	// replica, how far that replica's writer had got (see
	// TaskSnapshot.SourceRecords): the copy's stream starts after it.
	restoredAt uint64
	// writtenSID is the stable id of the last result committed (writer
	// goroutine): results are identified in Kafka by stable id, the same
	// on every copy and replica whatever corrections took positions (see
	// stableIDs); equal to the position in a query without replicas.
	writtenSID uint64
}

// kafkaWriterName is the subscriber name under which a kafka sink's
// writer holds and acknowledges the sink's result stream.
const kafkaWriterName = "kafka-writer"

// kafkaSinkBuffer is the result stream of a kafka sink's writing replica
// (nil for any other task): not a ring, but a bounded buffer held by the
// writer, which acknowledges what Kafka committed. Nothing is discarded
// before it is written, and a slow or unreachable Kafka blocks the sink,
// and through the data plane the query (backpressure), instead of losing
// results. Tails read it as they read any stream.
func (t *task) kafkaSinkBuffer() *dataplane.OutputBuffer {
	if t.node.Kind != queryspec.KindSink || t.node.Sink.Kafka == nil || t.spec.Replica != 0 {
		return nil
	}
	opts := t.r.opts.Buffer
	opts.Ring = false
	opts.ExpectedSubscribers = 1
	opts.Logger = t.log.With("consumer", kafkaWriterName)
	buf := dataplane.NewOutputBuffer(opts)
	// Connected for the task's life: it is never overrun, only waited for.
	buf.Connect(kafkaWriterName)
	return buf
}

// TransactionalID is the Kafka transactional id of a query's kafka sink:
// the same for every copy and replica, so that one fences the others.
func kafkaTransactionalID(query, sink string) string {
	return "fedstream-" + query + "-" + sink
}

func newKafkaSink(t *task) (*kafkaSink, error) {
	cfg := t.node.Sink.Kafka
	ks := &kafkaSink{schema: t.node.Schema}
	for _, f := range cfg.Key {
		i := ks.schema.Index(f)
		if i < 0 {
			return nil, fmt.Errorf("kafka sink %s: key field %q is not in its schema", t.node.Name, f)
		}
		ks.keyIdx = append(ks.keyIdx, i)
	}
	ks.w = kafka.NewWriter(kafka.WriterConfig{
		Brokers: cfg.Brokers, Topic: cfg.Topic,
		TransactionalID: kafkaTransactionalID(t.spec.Query, t.node.Name),
		Sink:            t.spec.Query + "/" + t.node.Name,
		Run:             t.spec.QueryIndex,
		Log:             t.log,
	})
	return ks, nil
}

// runKafkaSink follows the sink's result stream and writes its results.
func (t *task) runKafkaSink() {
	ctx := t.ctx
	ks := t.kafkaOut
	buf := t.outs[0].buf
	defer ks.w.Close()
	backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.New()
	open := false
	var (
		outs    []kafka.Out
		tp      tuple.Tuple
		scratch []byte
		failing bool
	)
	fail := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		t.log.Warn("kafka sink: "+what+"; retrying", "err", err)
		t.noteWhileRunning(fmt.Sprintf("%v (retrying)", err))
		failing = true
		ks.w.Close()
		open = false
		return backoff.Wait(ctx) == nil
	}
	for ctx.Err() == nil {
		if !open {
			last, err := ks.w.Open(ctx)
			if err != nil {
				if !fail("open", err) {
					return
				}
				continue
			}
			open = true
			// Kafka holds every result up to stable id last; up to
			// restoredAt every position is in Kafka or is not a result.
			// A stable id read as a position is never beyond that
			// result's position (see stableIDs): reading after it
			// skips nothing, and what Kafka has is recognised by stable
			// id below.
			ra := ks.restoredAt
			ks.writtenSID = max(ks.writtenSID, last, ra-min(ra, buf.PositionOffset(ra)))
			ks.written.Store(max(last, ra, ks.written.Load()))
			t.log.Info("kafka sink: writing after the last committed result", "topic", t.node.Sink.Kafka.Topic, "last_committed", last)
		}
		written := ks.written.Load()
		// What Kafka has is taken (clamped to the stream's end: a copy
		// replaying behind Kafka releases its results as they come).
		buf.Ack(kafkaWriterName, written)
		data, offs, base, first, _, wait, err := buf.ReadIndexed(written, 1<<20)
		if err != nil {
			return // the buffer closed: the task stops
		}
		if len(offs) == 0 {
			select {
			case <-wait:
			case <-ctx.Done():
				return
			}
			continue
		}
		if first > written+1 {
			// The stream no longer holds them (a copy started from a
			// snapshot far ahead of what was committed): say so loudly.
			msg := fmt.Sprintf("kafka: the results among ids %d..%d (if any: some may be boundaries) were not written to the topic: the sink's result stream no longer holds them", written+1, first-1)
			t.log.Error("kafka sink: results may be lost", "first", written+1, "last", first-1)
			ks.gaps.Add(1)
			t.noteWhileRunning(msg)
			failing = false // the note stays: a later success does not clear it
		}
		outs = outs[:0]
		scratch = scratch[:0]
		type span struct{ k0, k1, v0, v1 int }
		var spans []span
		last := first + uint64(len(offs)) - 1
		// Stable ids: the stable id of the batch's last stable tuple
		// less the stable tuples and boundaries in it, counted on.
		sid := last - min(last, buf.PositionOffset(last))
		for _, o := range offs {
			if typ := tuple.PeekType(data[o-base:]); typ == tuple.Stable || typ == tuple.Boundary {
				sid--
			}
		}
		for i, o := range offs {
			if _, err := tuple.DecodeTuple(data[o-base:], &tp); err != nil {
				t.fail(fmt.Errorf("kafka sink: result %d: %w", first+uint64(i), err))
				return
			}
			if tp.Type == tuple.Boundary {
				sid++
			}
			if tp.Type == tuple.Uncorrectable {
				ks.uncorrectable.Add(1)
				from, to, _ := tuple.UncorrectableRange(&tp)
				t.log.Warn("kafka sink: results written to the topic could not be corrected (a DCAA failure outlasted the replay bound)",
					"from", time.Unix(0, from).UTC(), "to", time.Unix(0, to).UTC(), "count", ks.uncorrectable.Load())
			}
			if tp.Type != tuple.Stable {
				continue // tentative results and corrections stay out
			}
			if sid++; sid <= ks.writtenSID {
				continue // in Kafka already
			}
			var sp span
			sp.k0 = len(scratch)
			if len(ks.keyIdx) > 0 {
				scratch = kafka.AppendJSON(scratch, ks.schema, tp.Values, ks.keyIdx)
			}
			sp.k1, sp.v0 = len(scratch), len(scratch)
			scratch = kafka.AppendJSON(scratch, ks.schema, tp.Values, nil)
			sp.v1 = len(scratch)
			spans = append(spans, sp)
			outs = append(outs, kafka.Out{ID: sid})
		}
		for i, sp := range spans {
			if sp.k1 > sp.k0 {
				outs[i].Key = scratch[sp.k0:sp.k1]
			}
			outs[i].Value = scratch[sp.v0:sp.v1]
		}
		if hook := t.r.kafkaBeforeWrite; hook != nil {
			hook(ctx)
		}
		if err := ks.w.Write(ctx, outs); err != nil {
			if !fail("write", err) {
				return
			}
			continue
		}
		if len(outs) > 0 {
			ks.writes.Add(1)
			ks.writtenSID = outs[len(outs)-1].ID
		}
		backoff.Reset()
		if failing {
			failing = false
			t.noteWhileRunning("")
		}
		ks.written.Store(last)
		buf.Ack(kafkaWriterName, last)
	}
}
