package runtime

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

const ingestMoveQuery = `
name: ing
replicas: %d
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    ingest: true
operators:
  - name: per_user
    type: aggregate
    input: events
    window: {size: 1s}
    group_by: [user]
    aggregates: {n: "count()", total: "sum(amount)"}
sinks:
  - {name: out, input: per_user}
`

// lateIngestQuery is ingestMoveQuery with an hour of allowed lateness.
func lateIngestQuery(replicas int) string {
	return strings.Replace(fmt.Sprintf(ingestMoveQuery, replicas), "    ingest: true\n", "    ingest: true\n    allowed_lateness: 1h\n", 1)
}

// ingestMoveInput is n records, 10ms of event time apart, over 7 users.
func ingestMoveInput(n int) []string {
	recs := make([]string, n)
	for i := range n {
		recs[i] = fmt.Sprintf(`{"time": %d, "user": "u%d", "amount": %d}`, int64(i+1)*10_000_000, i%7, i%5)
	}
	return recs
}

// ingestMoveReference is the per-window, per-user count and total the
// input gives, as the sink prints them.
func ingestMoveReference(n int) []string {
	type key struct {
		end  int64
		user string
	}
	agg := map[key][2]int64{}
	for i := range n {
		ns := int64(i+1) * 10_000_000
		k := key{(ns/1_000_000_000 + 1) * 1_000_000_000, fmt.Sprintf("u%d", i%7)}
		v := agg[k]
		v[0]++
		v[1] += int64(i % 5)
		agg[k] = v
	}
	var out []string
	for k, v := range agg {
		out = append(out, fmt.Sprintf("%s n=%d total=%d end=%d", k.user, v[0], v[1], k.end))
	}
	slices.Sort(out)
	return out
}

// sinkResults reads a sink replica to its end: one line per result.
func sinkResults(t *testing.T, c *cluster, sink string) []string {
	t.Helper()
	var out []string
	for _, tp := range sinkData(t, c, sink) {
		out = append(out, fmt.Sprintf("%s n=%d total=%d end=%d", tp.Values[0].S, tp.Values[1].I, tp.Values[2].I, tp.Values[3].I))
	}
	slices.Sort(out)
	return out
}

// addrBook is where the test says the source's copies run (the
// coordinator's query status in a real cluster).
type addrBook struct {
	mu    sync.Mutex
	addrs map[string]string
}

func (b *addrBook) set(id, addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addrs[id] = addr
}

func (b *addrBook) resolve(context.Context) ([]dataplane.IngestCopy, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []dataplane.IngestCopy
	for id, addr := range b.addrs {
		out = append(out, dataplane.IngestCopy{TaskID: id, Addr: addr})
	}
	return out, nil
}

// TestIngestSourceMovesUnderLoad moves an ingest source's copy (with one
// and with two replicas) while a client sends it lines continuously, and
// checks every sink replica's results against a run without the move and
// against the reference computed from the input: nothing lost, nothing
// counted twice. The client only learns the new place by being refused by
// the old copy (ErrSourceMoved) and asking again.
func TestIngestSourceMovesUnderLoad(t *testing.T) {
	const records, batch = 3000, 25
	input := ingestMoveInput(records)
	want := ingestMoveReference(records)
	for _, tc := range []struct {
		replicas int
		late     bool
	}{{1, false}, {2, false}, {1, true}, {2, true}} {
		replicas := tc.replicas
		// Without lateness the boundaries move with every request (the
		// snapshot carries the last one); with an hour of it, a line
		// taken twice would be accepted twice.
		t.Run(fmt.Sprintf("replicas=%d,lateness=%v", replicas, tc.late), func(t *testing.T) {
			yaml := fmt.Sprintf(ingestMoveQuery, replicas)
			if tc.late {
				yaml = lateIngestQuery(replicas)
			}
			run := func(move bool) [][]string {
				c := newCluster(t, 3, yaml, func(_ string, _, r int) int { return r })
				defer c.close(t)
				c.apply()
				book := &addrBook{addrs: map[string]string{}}
				for r := range replicas {
					id := queryspec.TaskID("ing", "events", 0, r)
					book.set(id, c.addrOf(id))
				}
				var notes []string
				var notesMu sync.Mutex
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				cl, err := dataplane.NewIngestClient(ctx, dataplane.IngestClientConfig{Query: "ing", Source: "events", Producer: "test-producer",
					Resolve: book.resolve, Conn: func(addr string) (grpc.ClientConnInterface, error) { return c.pool.Conn(addr) },
					Note: func(m string) { notesMu.Lock(); notes = append(notes, m); notesMu.Unlock() }})
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				sent := make(chan error, 1)
				go func() {
					for i := 0; i < records; i += batch {
						if err := cl.Send(ctx, []byte(strings.Join(input[i:min(i+batch, records)], "\n")+"\n")); err != nil {
							sent <- err
							return
						}
					}
					sent <- cl.CloseSource(ctx)
				}()
				moving := queryspec.TaskID("ing", "events", 0, 0)
				if move {
					from, to := c.workers[0], c.workers[2]
					waitUntil(t, "the source took a good part of the input", func() bool {
						tk := from.rt.task(moving)
						return tk != nil && tk.outs[0].buf.Stats().LastID > records/4
					})
					c.move(t, moving, from, to, true)
					book.set(moving, to.addr)
				}
				if err := <-sent; err != nil {
					t.Fatalf("ingest: %v", err)
				}
				res := cl.Result()
				if res.Accepted != records || len(res.Errors) != 0 || !res.Closed || res.Copies != replicas {
					t.Fatalf("client result %+v, want %d accepted by %d copies and closed", res, records, replicas)
				}
				if move {
					notesMu.Lock()
					n := len(notes)
					notesMu.Unlock()
					if n == 0 {
						t.Errorf("the client never reconnected: the move did not take the source away")
					}
					if tk := c.workers[2].rt.task(moving); tk == nil || !tk.restored {
						t.Fatalf("the moved copy did not start from the snapshot")
					}
				}
				var out [][]string
				for r := range replicas {
					out = append(out, sinkResults(t, c, queryspec.TaskID("ing", "out", 0, r)))
				}
				return out
			}
			unmoved := run(false)
			moved := run(true)
			for r := range replicas {
				if !slices.Equal(unmoved[r], want) {
					t.Fatalf("replica %d without a move: %d results, differs from the reference (%d)", r, len(unmoved[r]), len(want))
				}
				if !slices.Equal(moved[r], want) {
					t.Fatalf("replica %d with the move: %d results differ from the reference (%d):\n%s", r, len(moved[r]), len(want), diffLines(moved[r], want))
				}
			}
		})
	}
}

// diffLines names the lines only one side has (for failure messages).
func diffLines(got, want []string) string {
	var b strings.Builder
	for _, g := range got {
		if !slices.Contains(want, g) {
			fmt.Fprintf(&b, "  extra %s\n", g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			fmt.Fprintf(&b, "  missing %s\n", w)
		}
	}
	return b.String()
}

// session sends requests on one IngestSession and returns the answers (or
// the error that ended it).
func session(t *testing.T, c *cluster, addr string, reqs ...*fedstreampb.IngestRequest) ([]*fedstreampb.IngestResponse, error) {
	t.Helper()
	conn, err := c.pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).IngestSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*fedstreampb.IngestResponse
	for _, r := range reqs {
		if err := stream.Send(r); err != nil {
			_, err = stream.Recv()
			return out, err
		}
		resp, err := stream.Recv()
		if err != nil {
			return out, err
		}
		out = append(out, resp)
	}
	return out, stream.CloseSend()
}

// TestIngestSessionSkipsDuplicates: a producer that reconnects and resends
// lines the source already took (its acknowledgement was lost) has them
// skipped by offset, a gap is refused, and the producer's offsets and
// counts are in the source's state.
func TestIngestSessionSkipsDuplicates(t *testing.T) {
	c := newCluster(t, 1, lateIngestQuery(1), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	addr := c.workers[0].addr
	recs := ingestMoveInput(8)
	lines := func(first, last int) []byte { return []byte(strings.Join(recs[first-1:last], "\n") + "\n") }
	hello := &fedstreampb.IngestRequest{Query: "ing", Source: "events", Producer: "p1"}
	resps, err := session(t, c, addr, hello, &fedstreampb.IngestRequest{FirstLine: 1, Lines: lines(1, 3)})
	if err != nil || len(resps) != 2 || resps[0].Acked != 0 || resps[1].Acked != 3 || resps[1].Accepted != 3 {
		t.Fatalf("first session: %v %v", resps, err)
	}
	// Reconnect: the handshake says 3 lines were taken; resending 1-5
	// takes only 4 and 5.
	resps, err = session(t, c, addr, hello, &fedstreampb.IngestRequest{FirstLine: 1, Lines: lines(1, 5)})
	if err != nil || len(resps) != 2 || resps[0].Acked != 3 || resps[1].Acked != 5 || resps[1].Accepted != 2 || resps[1].ProducerAccepted != 5 {
		t.Fatalf("resending session: %v %v", resps, err)
	}
	// A gap (lines 7-8 while 6 is missing) is refused.
	_, err = session(t, c, addr, hello, &fedstreampb.IngestRequest{FirstLine: 7, Lines: lines(7, 8)})
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("gap: %v, want OutOfRange", err)
	}
	// Another producer has its own offsets.
	resps, err = session(t, c, addr, &fedstreampb.IngestRequest{Query: "ing", Source: "events", Producer: "p2", FirstLine: 1, Lines: lines(6, 8)},
		&fedstreampb.IngestRequest{Close: true})
	if err != nil || len(resps) != 2 || resps[0].Acked != 3 || resps[0].Accepted != 3 || !resps[1].Closed {
		t.Fatalf("second producer: %v %v", resps, err)
	}
	got := sinkResults(t, c, queryspec.TaskID("ing", "out", 0, 0))
	if want := ingestMoveReference(8); !slices.Equal(got, want) {
		t.Fatalf("results:\n%s", diffLines(got, want))
	}
}

// TestIngestSnapshotEncoding: an ingest source's position survives the
// snapshot encoding, and a peer's (non-halting) snapshot is refused.
func TestIngestSnapshotEncoding(t *testing.T) {
	s := &TaskSnapshot{TaskID: "q/events/p0/r0", Query: "q", Fragment: "events", Released: 5, Seq: 9,
		Ingest: &IngestPosition{Newest: 7, Boundary: 5, Closed: true, Producers: []IngestProducer{{ID: "a", Acked: 10, Accepted: 8}, {ID: "b", Acked: 3, Accepted: 3}}}}
	enc, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got TaskSnapshot
	if err := got.UnmarshalBinary(enc); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(*got.Ingest) != fmt.Sprint(*s.Ingest) {
		t.Fatalf("decoded %+v, want %+v", *got.Ingest, *s.Ingest)
	}
	enc[len(enc)-1-len(appendIngestPosition(nil, s.Ingest))+1] = 'X'
	if err := got.UnmarshalBinary(enc); err == nil {
		t.Fatalf("a bad ingest section tag decoded")
	}

	c := newCluster(t, 1, fmt.Sprintf(ingestMoveQuery, 1), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	id := queryspec.TaskID("ing", "events", 0, 0)
	waitUntil(t, "the source runs", func() bool { return c.workers[0].rt.task(id) != nil })
	if _, err := c.workers[0].rt.SnapshotTask(context.Background(), id, SnapshotOptions{}); err == nil || !strings.Contains(err.Error(), "only to move") {
		t.Fatalf("a live peer snapshot of an ingest source: %v", err)
	}
}

// lossyConn drops the answer to every third data request of a stream: the
// copy took the lines, the client never hears it and its stream fails.
type lossyConn struct {
	grpc.ClientConnInterface
	mu      sync.Mutex
	answers int
	dropped int
}

func (c *lossyConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &lossyStream{ClientStream: s, c: c}, nil
}

type lossyStream struct {
	grpc.ClientStream
	c *lossyConn
}

func (s *lossyStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	resp, ok := m.(*fedstreampb.IngestResponse)
	if !ok || resp.Acked == 0 {
		return nil // a handshake
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.c.answers++; s.c.answers%3 == 0 {
		s.c.dropped++
		return status.Error(codes.Unavailable, "test: answer lost")
	}
	return nil
}

// TestIngestClientResendsAfterLostAnswers: answers lost after the source
// took the lines make the client reconnect; the new session's handshake
// tells it the copy has them, so it goes on after them (a copy that took
// only part of a batch gets the batch again and skips the part by offset:
// TestIngestSessionSkipsDuplicates). The results equal the reference.
func TestIngestClientResendsAfterLostAnswers(t *testing.T) {
	const records, batch = 600, 20
	// With an hour of allowed lateness a line sent twice would be
	// accepted twice: only its offset tells it apart.
	c := newCluster(t, 1, lateIngestQuery(1), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	id := queryspec.TaskID("ing", "events", 0, 0)
	book := &addrBook{addrs: map[string]string{id: c.addrOf(id)}}
	lossy := &lossyConn{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := dataplane.NewIngestClient(ctx, dataplane.IngestClientConfig{Query: "ing", Source: "events", Producer: "lossy",
		Resolve: book.resolve, Conn: func(addr string) (grpc.ClientConnInterface, error) {
			conn, err := c.pool.Conn(addr)
			lossy.ClientConnInterface = conn
			return lossy, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	input := ingestMoveInput(records)
	for i := 0; i < records; i += batch {
		if err := cl.Send(ctx, []byte(strings.Join(input[i:i+batch], "\n")+"\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.CloseSource(ctx); err != nil {
		t.Fatal(err)
	}
	if lossy.dropped == 0 {
		t.Fatal("no answer was lost: the test proves nothing")
	}
	if res := cl.Result(); res.Accepted != records {
		t.Fatalf("accepted %d, want %d", res.Accepted, records)
	}
	got := sinkResults(t, c, queryspec.TaskID("ing", "out", 0, 0))
	if want := ingestMoveReference(records); !slices.Equal(got, want) {
		t.Fatalf("results:\n%s", diffLines(got, want))
	}
}

// TestIngestMoveKeepsLatenessAndClose: the moved copy judges lateness
// against the newest record the old copy accepted, is closed if the old
// one was, and keeps the producer's offset; the old copy refuses lines
// and close after its snapshot.
func TestIngestMoveKeepsLatenessAndClose(t *testing.T) {
	c := newCluster(t, 2, fmt.Sprintf(ingestMoveQuery, 1), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	id := queryspec.TaskID("ing", "events", 0, 0)
	from, to := c.workers[0], c.workers[1]
	recs := ingestMoveInput(5)
	hello := &fedstreampb.IngestRequest{Query: "ing", Source: "events", Producer: "p"}
	if _, err := session(t, c, from.addr, hello, &fedstreampb.IngestRequest{FirstLine: 1, Lines: []byte(strings.Join(recs[:4], "\n") + "\n")}); err != nil {
		t.Fatal(err)
	}
	c.move(t, id, from, to, true)
	// The old copy was stopped by the move; its refusal is tested on a
	// snapshot taken directly below.
	resps, err := session(t, c, to.addr, hello, &fedstreampb.IngestRequest{FirstLine: 5, Lines: []byte(recs[0] + "\n" + recs[4] + "\n")})
	if err != nil || len(resps) != 2 || resps[0].Acked != 4 || resps[1].Acked != 6 || resps[1].Accepted != 1 || len(resps[1].Errors) != 1 ||
		!strings.Contains(resps[1].Errors[0].Error, "late record") || resps[1].Generation != 2 {
		t.Fatalf("after the move: %v %v (want line 5 refused as late, line 6 accepted, by generation 2)", resps, err)
	}
	if _, err := session(t, c, to.addr, hello, &fedstreampb.IngestRequest{Close: true}); err != nil {
		t.Fatal(err)
	}
	// Moved again, closed: the copy stays closed and the snapshot halted
	// the old copy (asked again, it gives the same snapshot).
	snap, err := to.rt.SnapshotTask(context.Background(), id, SnapshotOptions{Halt: true})
	if err != nil || snap.Ingest == nil || !snap.Ingest.Closed || len(snap.Ingest.Producers) != 1 || snap.Ingest.Producers[0].Acked != 6 {
		t.Fatalf("snapshot of the moved copy: %+v %v", snap, err)
	}
	if again, err := to.rt.SnapshotTask(context.Background(), id, SnapshotOptions{Halt: true}); err != nil || again != snap {
		t.Fatalf("second halting snapshot: %v, want the same", err)
	}
	if _, err := session(t, c, to.addr, hello, &fedstreampb.IngestRequest{FirstLine: 7, Lines: []byte(recs[4] + "\n")}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "moved") {
		t.Fatalf("lines to a snapshotted copy: %v, want Unavailable (moved)", err)
	}
	if _, err := session(t, c, to.addr, hello, &fedstreampb.IngestRequest{Close: true}); status.Code(err) != codes.Unavailable {
		t.Fatalf("close of a snapshotted copy: %v, want Unavailable (moved)", err)
	}
	third := c.workers[0]
	c.move(t, id, to, third, true)
	if _, err := session(t, c, third.addr, hello, &fedstreampb.IngestRequest{FirstLine: 7, Lines: []byte(recs[4] + "\n")}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("lines to the closed source after a second move: %v, want FailedPrecondition (closed)", err)
	}
}

// TestIngestMoveWithoutSnapshotFails: a moved ingest source whose old
// copy's snapshot cannot be fetched fails instead of starting empty (it
// would number its output from the start again and know no producer).
func TestIngestMoveWithoutSnapshotFails(t *testing.T) {
	c := newCluster(t, 2, fmt.Sprintf(ingestMoveQuery, 1), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	id := queryspec.TaskID("ing", "events", 0, 0)
	to := c.workers[1]
	var moved TaskSpec
	for _, s := range c.specs[c.workers[0]] {
		if s.TaskID == id {
			moved = s
		}
	}
	moved.Generation = 2
	// Generation 5 does not run there: the fetch is refused.
	moved.Bootstrap = &SnapshotSource{WorkerAddr: c.workers[0].addr, TaskID: id, Generation: 5, Halt: true}
	to.rt.Apply(context.Background(), append(c.specs[to], moved))
	for _, st := range to.rt.States() {
		if st.TaskID == id {
			if st.State != StateFailed || !strings.Contains(st.Message, "does not start empty") {
				t.Fatalf("moved ingest source without its snapshot: %+v", st)
			}
			return
		}
	}
	t.Fatalf("the moved copy is not in the runtime")
}
