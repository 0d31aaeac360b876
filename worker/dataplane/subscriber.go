package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrStopSubscription, returned by a DeliverFunc, ends the subscription
// after the batch is acknowledged; Run then returns nil.
var ErrStopSubscription = errors.New("dataplane: subscription stopped by consumer")

// ErrProtocol means an upstream sent a batch that does not decode or does
// not match its header.
var ErrProtocol = errors.New("dataplane: malformed batch")

// Batch is a decoded batch handed to a DeliverFunc: only tuples newer than
// everything delivered before (duplicates after a resubscription are
// dropped), in stream order.
//
// The tuples and their values (strings included) live in memory owned by
// this batch alone and never reused, so a consumer may keep them.
type Batch struct {
	Tuples []tuple.Tuple
	// LastID is the id of the last tuple in Tuples.
	LastID uint64
}

// DeliverFunc consumes one batch. It may block (that is flow control: the
// subscription stops reading, the HTTP/2 window fills and the upstream's
// buffer stops draining) and should honour ctx. The batch is acknowledged
// when DeliverFunc returns nil or ErrStopSubscription.
type DeliverFunc func(ctx context.Context, b *Batch) error

// Subscriber pulls one stream, possibly over successive connections to
// different replicas of the producer: each Run resumes after the last id
// delivered, so nothing is lost or delivered twice as long as the replicas
// assign identical ids.
type Subscriber struct {
	ref   *fedstreampb.StreamRef
	name  string
	noAck bool
	last  atomic.Uint64
}

// NewSubscriber prepares a subscription to ref that will resume after
// afterID. name identifies the subscriber for acknowledgement accounting (a
// downstream task uses its task id, so its replacement inherits its place);
// noAck subscribers (tail clients) never hold the upstream buffer back.
func NewSubscriber(ref *fedstreampb.StreamRef, name string, noAck bool, afterID uint64) *Subscriber {
	s := &Subscriber{ref: ref, name: name, noAck: noAck}
	s.last.Store(afterID)
	return s
}

// LastID is the id of the last tuple delivered (or the initial afterID).
func (s *Subscriber) LastID() uint64 { return s.last.Load() }

// Ref is the stream this subscriber pulls.
func (s *Subscriber) Ref() *fedstreampb.StreamRef { return s.ref }

// Run subscribes over conn and delivers batches until ctx ends, the stream
// fails, or deliver returns an error. It returns nil only when deliver
// returned ErrStopSubscription; a server-ended stream is an error (io.EOF
// wrapped) so the caller can resubscribe, possibly elsewhere.
func (s *Subscriber) Run(ctx context.Context, conn grpc.ClientConnInterface, deliver DeliverFunc) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // also ends the RPC, whatever the exit path
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	after := s.last.Load()
	open := &fedstreampb.SubscribeRequest{Stream: s.ref, AfterId: after, Subscriber: s.name, NoAck: s.noAck}
	if !s.noAck {
		open.AckId = after
	}
	if err := stream.Send(open); err != nil {
		return recvError(stream, err)
	}
	ack := &fedstreampb.SubscribeRequest{}
	var one tuple.Tuple
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return fmt.Errorf("dataplane: upstream ended the stream: %w", err)
		}
		if err != nil {
			return err
		}
		b, err := decodeBatch(msg, s.last.Load(), &one)
		if err != nil {
			return err
		}
		if len(b.Tuples) == 0 {
			continue // only duplicates
		}
		derr := deliver(ctx, b)
		if derr != nil && !errors.Is(derr, ErrStopSubscription) {
			return derr
		}
		s.last.Store(b.LastID)
		if !s.noAck {
			ack.AckId = b.LastID
			if err := stream.Send(ack); err != nil {
				return recvError(stream, err)
			}
		}
		if derr != nil {
			return nil
		}
	}
}

// recvError turns a failed Send into the stream's real status: gRPC
// reports io.EOF from Send and the cause from Recv.
func recvError(stream fedstreampb.DataPlane_SubscribeClient, err error) error {
	if err == io.EOF {
		if _, rerr := stream.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// decodeBatch decodes msg, keeping tuples with id > after. All values of
// the batch share one array, so a batch costs a few allocations, not a few
// per tuple.
func decodeBatch(msg *fedstreampb.Batch, after uint64, scratch *tuple.Tuple) (*Batch, error) {
	b := &Batch{Tuples: make([]tuple.Tuple, 0, msg.Count)}
	var values []tuple.Value
	r := tuple.NewBatchReader(msg.Data)
	prev := after
	n := 0
	for r.Next(scratch) {
		n++
		if scratch.ID <= prev {
			if len(b.Tuples) > 0 {
				return nil, fmt.Errorf("%w: id %d after %d", ErrProtocol, scratch.ID, prev)
			}
			continue // already delivered before a resubscription
		}
		prev = scratch.ID
		if values == nil {
			values = make([]tuple.Value, 0, int(msg.Count)*max(1, len(scratch.Values)))
		}
		start := len(values)
		values = append(values, scratch.Values...)
		t := *scratch
		t.Values = values[start:len(values):len(values)]
		b.Tuples = append(b.Tuples, t)
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if n != int(msg.Count) {
		return nil, fmt.Errorf("%w: header says %d tuples, data holds %d", ErrProtocol, msg.Count, n)
	}
	if n > 0 && prev != msg.LastId && len(b.Tuples) > 0 {
		return nil, fmt.Errorf("%w: header says last id %d, data ends with %d", ErrProtocol, msg.LastId, prev)
	}
	if len(b.Tuples) > 0 {
		b.LastID = prev
	}
	return b, nil
}

// Subscribe is the one-shot form of NewSubscriber(ref, name, false,
// afterID).Run(ctx, conn, deliver); it returns the last id delivered.
func Subscribe(ctx context.Context, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, afterID uint64, name string, deliver DeliverFunc) (uint64, error) {
	s := NewSubscriber(ref, name, false, afterID)
	err := s.Run(ctx, conn, deliver)
	return s.LastID(), err
}
