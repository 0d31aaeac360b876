package runtime

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Every replica of an upstream partition lost: the copy started without
// state numbers its stable ids in a lineage of its own, from its first
// tuple (its record of what it cannot vouch for, then its first
// results). Both sinks acknowledge to it by stable ids of the lost
// copies' numbering before they realign onto it: the other sink's ack
// relay, this sink's own relay while it reads the lost copy, and this
// sink's resumption by stable id (the copy has fewer positions than that
// id, and a subscription whose replica is behind acknowledges where it
// resumes). Taken as positions (clamped to the copy's last), they
// discarded the copy's record and first results before this sink
// realigned onto them: it named a gap and missed results that were not
// lost upstream (docs/DATAPLANE.md, "Every replica of a partition lost at
// once"). Acknowledgements tagged with their lineage are taken by stream
// time on a stream of another numbering, so this sink gets every result
// the copy produced: the lost copy's up to where it switched, the copy's
// from there, naming only the copy's own record.
func TestDCAAAcksOfAnotherLineageDiscardNothing(t *testing.T) {
	forSinkKinds(t, "", func(t *testing.T, r *sinkRig) {
		ms, st, bd, exact := msWindows()
		// The lost copy (the shared numbering): the sink takes it up to
		// the boundary at 35 ms (stable id 6).
		r.fake.put(t, r.up0, dataplane.BufferOptions{ExpectedSubscribers: 2, Lease: time.Hour}, 0, exact[:6]...)
		// The copy started without state: its record, its first window
		// (inexact: 904 where the failure-free run has 4), 3 positions
		// so far; two downstream replicas expected, as in a query of
		// replicas 2.
		b1 := r.fake.put(t, r.up1, dataplane.BufferOptions{ExpectedSubscribers: 2, Lease: time.Hour}, 0,
			tuple.UncorrectableMarker(math.MinInt64, ms(55)), st(40, 904), bd(45))
		b1.Diverge(0)
		b1.NoteUncorrectable(math.MinInt64, ms(55))

		// The other sink took the lost copies' stream up to the boundary
		// at 55 ms (stable id 10) and relays it to the copy.
		conn, err := r.c.pool.Conn(r.fake.addr)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		relayed := make(chan error, 1)
		go func() {
			relayed <- dataplane.RelayAcksTagged(ctx, conn, &fedstreampb.StreamRef{Query: r.c.query.Name, TaskId: r.up1, Consumer: "out"},
				"other", true, func() (uint64, dataplane.StableTag) {
					return 10, dataplane.StableTag{Known: true, ID: 10, STime: ms(55)}
				})
		}()
		t.Cleanup(func() { cancel(); <-relayed })
		waitUntil(t, "the other sink's relayed acknowledgement applied", func() bool {
			return b1.Stats().LaggardAck >= 2 // before the copy's first boundary; 3 (all of it) taken by id
		})

		r.took(t, 6)
		r.fake.kill(r.up0)
		// The sink resumes on the copy after its stable id 6, past the
		// copy's 3 positions; the rest of the copy's stream comes after.
		waitUntil(t, "the sink subscribing to the copy", func() bool { return b1.Wanted() >= 6 })
		for _, tp := range append([]tuple.Tuple{st(50, 905), bd(55)}, append(exact[10:], tuple.Tuple{Type: tuple.Boundary, STime: math.MaxInt64})...) {
			tp.ID = b1.Stats().LastID + 1
			if tp.STime == math.MaxInt64 {
				b1.SetEnd(tp.ID)
			}
			if err := b1.Append(context.Background(), &tp); err != nil {
				t.Fatal(err)
			}
		}
		got := viewOf(r.c.tail(t, r.sink))
		var named [][2]int64
		for k := range got.uncorrectable {
			if f, e, ok := tuple.UncorrectableRange(&got.uncorrectable[k]); ok {
				named = append(named, [2]int64{f, e})
			}
		}
		var values []int64
		for _, tp := range got.stable {
			if tp.Type == tuple.Stable {
				values = append(values, tp.Values[0].I)
			}
		}
		// The failure-free run's results, the copy's first two windows
		// in place of its own: what the lost copy gave up to 35 ms, then
		// every result of the copy.
		if want := []int64{1, 2, 3, 904, 905, 6, 7, 8, 9}; !slices.Equal(values, want) {
			t.Errorf("the sink's results %v, want %v (named %v)", values, want, named)
		}
		// Named: the copy's record, from what the sink took (35 ms); no
		// gap of its own.
		if want := [2]int64{ms(35), ms(55)}; len(named) != 1 || named[0] != want {
			t.Errorf("the sink named %v, want only the copy's record cut at 35 ms %v", named, want)
		}
	})
}
