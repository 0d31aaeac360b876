package benchmark

import (
	"fmt"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// splitServer wraps a runtime's DataPlane server to emulate a data plane
// without batching: every Batch it sends on a task-to-task stream is split
// into messages of one tuple each (so the subscriber also acknowledges
// every tuple). Result streams (consumer "") stay batched: they feed the
// measurement, not the pipeline.
//
// dataplane.Server has no knob for its batch size (MaxBatchBytes is a
// constant), hence the wrapper; the real server's reading, buffering and
// flow control are unchanged.
type splitServer struct {
	fedstreampb.DataPlaneServer
}

func (s splitServer) Subscribe(stream fedstreampb.DataPlane_SubscribeServer) error {
	return s.DataPlaneServer.Subscribe(&splitStream{DataPlane_SubscribeServer: stream})
}

// splitStream decides on the first request whether to split; Send is only
// called by the handler goroutine after that first Recv, so split needs no
// lock.
type splitStream struct {
	fedstreampb.DataPlane_SubscribeServer
	decided bool
	split   bool
	scratch tuple.Tuple
}

func (s *splitStream) Recv() (*fedstreampb.SubscribeRequest, error) {
	req, err := s.DataPlane_SubscribeServer.Recv()
	if err == nil && !s.decided {
		s.decided = true
		ref := req.GetStream()
		s.split = ref != nil && ref.Consumer != ""
	}
	return req, err
}

func (s *splitStream) Send(b *fedstreampb.Batch) error {
	if !s.split || b.Count <= 1 {
		return s.DataPlane_SubscribeServer.Send(b)
	}
	data := b.Data
	for len(data) > 0 {
		n, err := tuple.DecodeTuple(data, &s.scratch)
		if err != nil {
			return fmt.Errorf("split batch: %w", err)
		}
		// A fresh message per Send: gRPC may keep a sent message.
		one := &fedstreampb.Batch{Data: data[:n:n], Count: 1, LastId: s.scratch.ID}
		if err := s.DataPlane_SubscribeServer.Send(one); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}
