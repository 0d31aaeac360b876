package benchmark

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/runtime"
	"github.com/fedstream/fedstream/worker/tuple"
)

// streamEvent is one tuple of a sink's result stream as an events tail
// read it (bench dcaa): its position, type, stime, the formatted values
// of a result (formatRow) and the wall time it was read.
type streamEvent struct {
	ID    uint64     `json:"i"`
	Type  tuple.Type `json:"t"`
	STime int64      `json:"s"`
	Row   string     `json:"r,omitempty"`
	Nanos int64      `json:"n"`
}

// events follows the result stream of a sink task on this worker, without
// acknowledging, and records every tuple until the final boundary.
func (w *benchWorker) events(ctx context.Context, e *engine, spec runtime.TaskSpec) (response, error) {
	plan, err := spec.Spec.FusedPlan()
	if err != nil {
		return response{}, err
	}
	if node := plan.Node(spec.Fragment); node == nil || node.Kind != queryspec.KindSink {
		return response{}, fmt.Errorf("events: task %s is not a sink", spec.TaskID)
	}
	ref := &fedstreampb.StreamRef{Query: spec.Query, TaskId: spec.TaskID, Partition: int32(spec.Partition)}
	for {
		buf, err := e.rt.LocalStream(ref)
		if err == nil {
			var out []streamEvent
			out, err = readEvents(ctx, buf)
			if err == nil {
				return response{Events: out}, nil
			}
		}
		if !errors.Is(err, dataplane.ErrUnknownStream) || ctx.Err() != nil {
			return response{}, fmt.Errorf("events %s: %w", spec.TaskID, err)
		}
		// The sink is not there yet: poll.
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return response{}, ctx.Err()
		}
	}
}

// readEvents reads the result ring buf from its start until the final
// boundary. The ring never waits for this reader: a reader that fell a
// whole ring behind fails (errTailGap) rather than miss tuples.
func readEvents(ctx context.Context, buf *dataplane.OutputBuffer) ([]streamEvent, error) {
	var (
		out    []streamEvent
		tp     tuple.Tuple
		lastID uint64
	)
	for {
		data, offs, base, first, gap, wait, err := buf.ReadIndexed(lastID, tailReadBytes)
		if err != nil {
			return nil, err
		}
		if gap || (len(offs) > 0 && first != lastID+1) {
			return nil, fmt.Errorf("%w: after id %d", errTailGap, lastID)
		}
		if len(offs) == 0 {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		now := time.Now().UnixNano()
		for i := range offs {
			at := offs[i] - base
			if _, err := tuple.DecodeTuple(data[at:], &tp); err != nil {
				return nil, err
			}
			ev := streamEvent{ID: first + uint64(i), Type: tp.Type, STime: tp.STime, Nanos: now}
			if tp.Type.IsData() {
				ev.Row = formatRow(&tp)
			}
			out = append(out, ev)
			if tp.Type == tuple.Boundary && tp.STime == finalBoundary {
				return out, nil
			}
		}
		lastID = first + uint64(len(offs)) - 1
	}
}
