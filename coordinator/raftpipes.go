package coordinator

import (
	"sync"

	"github.com/hashicorp/raft"
)

// raftTransport is hashicorp/raft's network transport with one addition:
// Close also closes every append pipeline still open.
//
// Why: a leader's replication goroutine can block for ever inside
// netPipeline.AppendEntries. The pipeline hands each sent request to its
// response decoder over an unbuffered channel, and the decoder hands each
// response to raft's pipelineDecode over another. When pipelineDecode
// stops (a newer term, a refused append) while a response is in flight,
// the decoder blocks on its hand-off, and the next AppendEntries (raft
// may still send one, e.g. the best-effort flush when replication stops)
// blocks on its own hand-off. Neither waits on the connection, so no
// deadline or closed socket frees them; only the pipeline's Close does,
// and raft calls that only after the blocked send returns. raft.Shutdown
// waits for that goroutine, so the coordinator could not shut down.
// NetworkTransport.Close closes only the listener, not pipelines.
//
// Embedding keeps every other method (and the optional interfaces raft
// looks for: WithClose, WithPreVote) exactly those of NetworkTransport.
type raftTransport struct {
	*raft.NetworkTransport

	mu        sync.Mutex
	closed    bool
	pipelines map[*trackedPipeline]struct{}
}

func newRaftTransport(t *raft.NetworkTransport) *raftTransport {
	return &raftTransport{NetworkTransport: t, pipelines: map[*trackedPipeline]struct{}{}}
}

// AppendEntriesPipeline opens a pipeline that Close will also close.
func (t *raftTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	tp := &trackedPipeline{AppendPipeline: p, owner: t}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = p.Close()
		return nil, raft.ErrTransportShutdown
	}
	t.pipelines[tp] = struct{}{}
	t.mu.Unlock()
	return tp, nil
}

// Close stops the transport, closes every open pipeline (which unblocks
// any goroutine sending on one) and the pooled outgoing connections. It
// is safe to call more than once and concurrently with raft's own Close.
func (t *raftTransport) Close() error {
	err := t.NetworkTransport.Close()
	t.mu.Lock()
	t.closed = true
	open := t.pipelines
	t.pipelines = map[*trackedPipeline]struct{}{}
	t.mu.Unlock()
	for p := range open {
		_ = p.AppendPipeline.Close()
	}
	// Pooled connections and the handlers of incoming ones.
	t.NetworkTransport.CloseStreams()
	return err
}

// trackedPipeline forgets itself in its transport when closed.
type trackedPipeline struct {
	raft.AppendPipeline
	owner *raftTransport
}

func (p *trackedPipeline) Close() error {
	p.owner.mu.Lock()
	delete(p.owner.pipelines, p)
	p.owner.mu.Unlock()
	return p.AppendPipeline.Close()
}
