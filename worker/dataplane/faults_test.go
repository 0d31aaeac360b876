package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// faultRig is a producer buffer served on one address and a subscriber
// reading it through a Pool that dials through Faults.
type faultRig struct {
	buf    *OutputBuffer
	addr   string
	faults *Faults
	pool   *Pool
	sub    *Subscriber
	got    atomic.Uint64 // last id delivered
	next   uint64        // next id to append
}

func newFaultRig(t *testing.T, wrapListener bool) *faultRig {
	t.Helper()
	r := &faultRig{buf: NewOutputBuffer(BufferOptions{}), faults: NewFaults(), next: 1}
	res := &mapResolver{bufs: map[string]*OutputBuffer{"up": r.buf}}
	if wrapListener {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(ServerOptions()...)
		fedstreampb.RegisterDataPlaneServer(srv, NewServer(res, nil, nil))
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(r.faults.Listener(lis)) }()
		t.Cleanup(func() { srv.Stop(); <-done })
		r.addr = lis.Addr().String()
	} else {
		r.addr = startServer(t, res)
	}
	r.pool = NewPool(r.faults.DialOption())
	t.Cleanup(func() { _ = r.pool.Close() })
	r.sub = NewSubscriber(&fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down-0", false, 0)
	return r
}

func (r *faultRig) append(t *testing.T, n int) {
	t.Helper()
	for range n {
		if err := r.buf.Append(context.Background(), dataTuple(r.next, fmt.Sprintf("p%d", r.next))); err != nil {
			t.Fatal(err)
		}
		r.next++
	}
}

// run subscribes in the background; the returned channel gets Run's
// result.
func (r *faultRig) run(ctx context.Context, t *testing.T) <-chan error {
	conn, err := r.pool.Conn(r.addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- r.sub.Run(ctx, conn, func(ctx context.Context, b *Batch) error {
			for _, tp := range b.Tuples {
				if want := r.got.Load() + 1; tp.ID != want {
					return fmt.Errorf("got id %d, want %d", tp.ID, want)
				}
				r.got.Store(tp.ID)
			}
			return nil
		})
	}()
	return done
}

// A link cut with Reset ends the subscription promptly with an error (the
// runtime's switch-over then tries another replica); dials fail while it
// is cut; once healed, a new subscription resumes with nothing lost.
func TestFaultsResetEndsSubscription(t *testing.T) {
	for _, incoming := range []bool{false, true} {
		t.Run(fmt.Sprintf("incoming=%v", incoming), func(t *testing.T) {
			r := newFaultRig(t, incoming)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r.append(t, 100)
			done := r.run(ctx, t)
			waitFor(t, "first tuples", func() bool { return r.got.Load() == 100 })
			if incoming {
				r.faults.CutIncoming(Reset)
			} else {
				r.faults.CutOutgoing(r.addr, Reset)
			}
			select {
			case err := <-done:
				if err == nil || ctx.Err() != nil {
					t.Fatalf("subscription ended with %v, want a failure", err)
				}
			case <-ctx.Done():
				t.Fatal("the cut was not noticed")
			}
			if !incoming {
				if _, err := r.faults.dial(ctx, r.addr); !errors.Is(err, ErrLinkCut) {
					t.Fatalf("dial through a cut link: %v, want ErrLinkCut", err)
				}
			}
			r.append(t, 100)
			r.faults.HealAll()
			// A fresh subscription (as the runtime retries) resumes.
			for r.got.Load() < 200 {
				done = r.run(ctx, t)
				waitFor(t, "the rest", func() bool { return r.got.Load() == 200 || len(done) > 0 })
				if r.got.Load() < 200 {
					if err := <-done; ctx.Err() != nil {
						t.Fatalf("no recovery: %v", err)
					}
				}
			}
			cancel()
			<-done
		})
	}
}

// A link cut with Hold delivers nothing and fails nothing; once healed,
// the same subscription continues with nothing lost.
func TestFaultsHoldStallsThenResumes(t *testing.T) {
	r := newFaultRig(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.append(t, 50)
	done := r.run(ctx, t)
	waitFor(t, "first tuples", func() bool { return r.got.Load() == 50 })
	r.faults.CutOutgoing(r.addr, Hold)
	r.append(t, 50)
	// Absence cannot be waited for: look a while. A held link never
	// delivers, so this cannot fail spuriously.
	time.Sleep(200 * time.Millisecond)
	if got := r.got.Load(); got != 50 {
		t.Fatalf("delivered up to %d through a held link", got)
	}
	select {
	case err := <-done:
		t.Fatalf("subscription ended on a held link: %v", err)
	default:
	}
	r.faults.CutOutgoing(r.addr, Open)
	waitFor(t, "the held tuples", func() bool { return r.got.Load() == 100 })
	if r.faults.BytesFrom(r.addr) == 0 {
		t.Fatal("no bytes counted from the producer")
	}
	cancel()
	<-done
}

func TestParseFaults(t *testing.T) {
	out, in, err := ParseFaults("# partition\ncut 127.0.0.1:7001\ncut 127.0.0.1:7002 hold  # silent\n\ncut-incoming reset\n")
	if err != nil {
		t.Fatal(err)
	}
	if out["127.0.0.1:7001"] != Reset || out["127.0.0.1:7002"] != Hold || len(out) != 2 || in != Reset {
		t.Fatalf("got %v, incoming %v", out, in)
	}
	for _, bad := range []string{"cut", "cut a b c", "cut a maybe", "drop a", "cut-incoming x"} {
		if _, _, err := ParseFaults(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
}
