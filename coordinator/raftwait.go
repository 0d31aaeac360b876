package coordinator

import (
	"context"

	"github.com/hashicorp/raft"
)

// awaitFuture returns f's outcome, or ctx's error if ctx ends first.
//
// f.Error() alone can wait for ever: hashicorp/raft (v1.7) does not answer
// every future when it shuts down. An Apply or Barrier whose entry has
// committed and sits in the queue to the FSM when raft stops is dropped
// (the FSM goroutine returns on shutdown without draining that queue, and
// these futures carry no shutdown channel). A leader's set-up write
// waiting on such a future held the leader loop, and with it
// Server.Shutdown, until the test binary was killed 8 minutes later.
//
// The goroutine that waits on f ends when raft answers f. For a future
// raft dropped that is never: it stays parked, holding only the future,
// after raft has stopped (one per dropped future, so at most a few per
// shutdown); nothing can wake it, as raft exposes no way to cancel a
// future.
func awaitFuture(ctx context.Context, f raft.Future) error {
	if ctx.Done() == nil {
		return f.Error()
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		// An answer that arrived together with the cancellation wins.
		select {
		case err := <-errc:
			return err
		default:
			return ctx.Err()
		}
	}
}
