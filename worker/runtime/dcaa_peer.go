package runtime

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dcaa"
)

// The DCAA permission protocol between peer replicas of a task partition
// (at most one reconciles at a time; ties go to the lower replica number,
// so another keeps serving): the machine's AskPermission and NotifyDone
// become DataPlane.Reconcile calls to the peers' workers, whose answers
// come back to the machine as PermissionReply; a peer's calls reach this
// task's machine as PermissionRequest and PeerDone. A peer that does not
// answer (down, unreachable, not placed) is presumed to grant after the
// machine's permission timeout.

// peerFigures count the permission messages of a task (tests, logs).
type peerFigures struct {
	// granted counts the grants this replica received; served the
	// requests from peers it answered.
	granted, served atomic.Uint64
}

// Reconcile serves a peer replica's permission message.
func (s dpServer) Reconcile(ctx context.Context, req *fedstreampb.ReconcileRequest) (*fedstreampb.ReconcileResponse, error) {
	t := s.r.task(req.TaskId)
	if t == nil || t.dm == nil || (req.Generation != 0 && int(req.Generation) != t.spec.Generation) {
		return nil, status.Errorf(codes.NotFound, "no task %q (generation %d) running DCAA here", req.TaskId, req.Generation)
	}
	replicas := max(1, t.plan.Query.Replicas)
	if req.From < 0 || int(req.From) >= replicas || int(req.From) == t.spec.Replica {
		return nil, status.Errorf(codes.InvalidArgument, "replica %d is not a peer of replica %d of %d", req.From, t.spec.Replica, replicas)
	}
	d := t.dm
	if req.Done {
		if err := d.post(ctx, dcaaEvent{ev: dcaa.PeerDone{From: int(req.From)}, ended: -1}); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return &fedstreampb.ReconcileResponse{}, nil
	}
	reply := make(chan bool, 1)
	if err := d.post(ctx, dcaaEvent{ev: dcaa.PermissionRequest{From: int(req.From)}, ended: -1, reply: reply}); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	select {
	case granted := <-reply:
		d.peers.served.Add(1)
		return &fedstreampb.ReconcileResponse{Granted: granted}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-t.ctx.Done():
		return nil, status.Error(codes.Unavailable, "task stopping")
	}
}

// sendPeer sends a permission request (done false) or a done notice to
// peer replica p, and hands a request's answer to the machine. Run by a
// goroutine of the task per message; errors are only logged: a peer that
// does not answer is presumed to grant after the machine's timeout.
func (d *dcaaRun) sendPeer(p int, done bool) {
	t := d.t
	pl, ok := t.replicaPlacement(t.spec.Fragment, t.spec.Partition, p)
	if !ok {
		t.log.Debug("dcaa: peer replica not placed; it will be presumed to grant", "peer", p)
		return
	}
	conn, err := t.r.pool.Conn(pl.WorkerAddr)
	if err != nil {
		t.log.Debug("dcaa: peer unreachable", "peer", p, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, 4*t.detectTimeout())
	defer cancel()
	resp, err := fedstreampb.NewDataPlaneClient(conn).Reconcile(ctx, &fedstreampb.ReconcileRequest{
		TaskId: pl.TaskID, Generation: int32(pl.Generation), From: int32(t.spec.Replica), Done: done})
	if err != nil {
		t.log.Debug("dcaa: permission message to peer failed", "peer", p, "done", done, "err", err)
		return
	}
	if done {
		return
	}
	if resp.Granted {
		d.peers.granted.Add(1)
	}
	_ = d.post(t.ctx, dcaaEvent{ev: dcaa.PermissionReply{From: p, Granted: resp.Granted}, ended: -1})
}

// messagePeers sends each peer its message on a goroutine of the task.
func (d *dcaaRun) messagePeers(peers []int, done bool) {
	for _, p := range peers {
		d.t.wg.Add(1)
		go func() { defer d.t.wg.Done(); d.sendPeer(p, done) }()
	}
}
