package runtime

import (
	"sync"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dcaa"
)

// Replica state hints (issue 10 item 2): the coordinator's known DCAA
// state of each upstream task copy, from the heartbeat answers
// (coordinator/replica_hints.go). An input hears in band only the
// replicas it reads; with the hints a machine's input re-subscribing
// prefers a STABLE replica it does not read (dcaa.UpstreamStates, a state
// heard in band since winning), and a sink's background read prefers a
// replica in STABILIZATION (dcaa_sinkbg.go).

// ReplicaStateHint is one upstream task copy's state as the coordinator
// knows it, Age old when it answered (received At, on this worker's
// clock).
type ReplicaStateHint struct {
	TaskID     string
	Generation int
	State      fedstreampb.ReplicaState
	Age        time.Duration
}

// hintKey names an upstream replica.
type hintKey struct {
	fragment           string
	partition, replica int
}

// hint is a replica's hinted state, known since at (this worker's clock).
type hint struct {
	state dcaa.State
	at    time.Time
}

// taskHints are the hints of a task's upstream replicas (sinks read them).
type taskHints struct {
	mu sync.Mutex
	m  map[hintKey]hint
}

func (h *taskHints) set(k hintKey, v hint) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[hintKey]hint{}
	}
	h.m[k] = v
}

func (h *taskHints) get(k hintKey) (hint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.m[k]
	return v, ok
}

// NoteReplicaStates hands the coordinator's hints, received at, to the
// tasks of replicated queries that read those copies. A hint of another
// copy than the one a task has placed (generation) is not that task's.
func (r *Runtime) NoteReplicaStates(hints []ReplicaStateHint, received time.Time) {
	if len(hints) == 0 {
		return
	}
	byID := make(map[string]ReplicaStateHint, len(hints))
	for _, h := range hints {
		byID[h.TaskID] = h
	}
	for _, t := range r.tasksByID() {
		if t.dcaaOn() {
			t.noteHints(byID, received)
		}
	}
}

// noteHints takes the hints of the task's upstream replicas: a machine
// hears each as an UpstreamStates event, dated (At) by the hint's age; a
// sink keeps them (hints).
func (t *task) noteHints(byID map[string]ReplicaStateHint, received time.Time) {
	for _, in := range t.inputsNow() {
		t.placeMu.Lock()
		pls := t.placements[placeKey{in.upstream, in.upPartition}]
		t.placeMu.Unlock()
		for _, pl := range pls {
			h, ok := byID[pl.TaskID]
			if !ok || max(h.Generation, 1) != max(pl.Generation, 1) {
				continue
			}
			st := dcaa.StateFromProto(h.State)
			if st == dcaa.Unknown {
				continue
			}
			at := received.Add(-h.Age)
			t.hints.set(hintKey{in.upstream, in.upPartition, pl.Replica}, hint{state: st, at: at})
			if d := t.dm; d != nil {
				states := make([]dcaa.State, pl.Replica+1)
				states[pl.Replica] = st
				// Machine time; 1 at the earliest (0 would mean now).
				ev := dcaa.UpstreamStates{Input: in.idx, States: states, At: max(int64(at.Sub(d.origin)), 1)}
				select {
				case d.events <- dcaaEvent{ev: ev, ended: -1}:
				default:
					// The machine is busy: a hint may be dropped, the
					// next heartbeat brings it again.
				}
			}
		}
	}
}
