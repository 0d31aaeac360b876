package runtime

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ingestReqs sends requests on one Ingest call and returns the response.
func ingestReqs(t *testing.T, c *cluster, addr string, reqs ...*fedstreampb.IngestRequest) (*fedstreampb.IngestResponse, error) {
	t.Helper()
	conn, err := c.pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Ingest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if err := stream.Send(r); err != nil {
			break // the answer says why
		}
	}
	return stream.CloseAndRecv()
}

// lines numbers records from first into one request.
func linesReq(first uint64, recs ...string) *fedstreampb.IngestRequest {
	return &fedstreampb.IngestRequest{Query: "ing", Source: "events", FirstLine: first, Lines: []byte(strings.Join(recs, "\n") + "\n")}
}

func userRec(ns int64, user string) string {
	return fmt.Sprintf(`{"time": %d, "user": %q, "amount": 1}`, ns, user)
}

// sinkData reads a sink's result stream to its final boundary and returns
// its data tuples.
func sinkData(t *testing.T, c *cluster, sinkTask string) []tuple.Tuple {
	t.Helper()
	var data []tuple.Tuple
	for _, tp := range c.tail(t, sinkTask) {
		if tp.Type.IsData() {
			data = append(data, tp)
		}
	}
	return data
}

// TestIngestEpochTimestamp: a record dated exactly the Unix epoch keeps
// stime 0 (it used to be replaced by the arrival time, which put it in a
// window near the wall clock and made every later record late).
func TestIngestEpochTimestamp(t *testing.T) {
	c := newCluster(t, 1, ingestQuery, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	resp, err := ingestReqs(t, c, c.workers[0].addr,
		linesReq(1, `{"time": "1970-01-01T00:00:00Z", "user": "epoch-rfc3339", "amount": 1}`, userRec(0, "epoch-int")),
		linesReq(3, userRec(int64(time.Second), "one-second-later")),
		&fedstreampb.IngestRequest{Close: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Accepted != 3 || len(resp.Errors) != 0 || !resp.Closed {
		t.Fatalf("response %+v", resp)
	}
	var got []string
	for _, tp := range sinkData(t, c, "ing/out/p0/r0") {
		got = append(got, fmt.Sprintf("%s@%d", tp.Values[1].S, tp.STime))
	}
	if want := []string{"epoch-rfc3339@0", "epoch-int@0", "one-second-later@1000000000"}; !slices.Equal(got, want) {
		t.Fatalf("sink got %v, want %v", got, want)
	}
}

// TestIngestLatenessPerRecord: whether a record is late does not depend on
// how the lines are batched. With allowed_lateness 0 a record earlier than
// the newest accepted one is refused in the same request as in the next
// one (before, it was accepted within a request and refused across
// requests); with allowed_lateness 10s, records up to 10s behind the
// newest are accepted, in or across requests. Every refused line is
// reported by its number.
func TestIngestLatenessPerRecord(t *testing.T) {
	recs := []string{
		userRec(10_000_000_000, "a"), // 10s
		userRec(30_000_000_000, "b"), // 30s
		userRec(25_000_000_000, "c"), // 5s behind the newest
		userRec(15_000_000_000, "d"), // 15s behind
		userRec(30_000_000_000, "e"), // equal to the newest
	}
	for _, tc := range []struct {
		lateness    string
		wantUsers   []string
		wantRefused []uint64
	}{
		{"", []string{"a", "b", "e"}, []uint64{3, 4}},
		{"10s", []string{"a", "b", "c", "e"}, []uint64{4}},
	} {
		for _, batch := range []int{1, 2, 5} {
			name := fmt.Sprintf("lateness=%q/batch=%d", tc.lateness, batch)
			q := ingestQuery
			if tc.lateness != "" {
				q = strings.Replace(q, "    ingest: true\n", "    ingest: true\n    allowed_lateness: "+tc.lateness+"\n", 1)
			}
			c := newCluster(t, 1, q, func(string, int, int) int { return 0 })
			var reqs []*fedstreampb.IngestRequest
			for i := 0; i < len(recs); i += batch {
				reqs = append(reqs, linesReq(uint64(i+1), recs[i:min(i+batch, len(recs))]...))
			}
			reqs = append(reqs, &fedstreampb.IngestRequest{Close: true})
			reqs[0].Query, reqs[0].Source = "ing", "events"
			c.apply()
			resp, err := ingestReqs(t, c, c.workers[0].addr, reqs...)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var refused []uint64
			for _, e := range resp.Errors {
				refused = append(refused, e.Line)
				if !strings.Contains(e.Error, fmt.Sprintf("line %d: late record", e.Line)) || !strings.Contains(e.Error, "allowed_lateness") {
					t.Errorf("%s: error %q", name, e.Error)
				}
			}
			var users []string
			for _, tp := range sinkData(t, c, "ing/out/p0/r0") {
				users = append(users, tp.Values[1].S)
			}
			c.close(t)
			if !slices.Equal(refused, tc.wantRefused) || !slices.Equal(users, tc.wantUsers) {
				t.Errorf("%s: refused lines %v, sink got %v; want %v and %v", name, refused, users, tc.wantRefused, tc.wantUsers)
			}
		}
	}
}

const ingestAggQuery = `
name: ing
replicas: 2
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    ingest: true
operators:
  - name: per_user
    type: aggregate
    input: events
    window: {size: 1m}
    group_by: [user]
    aggregates: {n: "count()", total: "sum(amount)"}
sinks:
  - {name: out, input: per_user}
`

// TestIngestCloseEmitsLastWindows: with two replicas, closing the source
// on both emits the last open window (which no later record would
// otherwise close) and ends every sink replica's stream with the final
// boundary; lines after the close are refused, and closing again is a
// no-op.
func TestIngestCloseEmitsLastWindows(t *testing.T) {
	c := newCluster(t, 2, ingestAggQuery, func(_ string, _, r int) int { return r })
	defer c.close(t)
	c.apply()
	src := []string{queryspec.TaskID("ing", "events", 0, 0), queryspec.TaskID("ing", "events", 0, 1)}
	for _, id := range src {
		resp, err := ingestReqs(t, c, c.addrOf(id),
			linesReq(1, userRec(1_000_000_000, "a"), userRec(2_000_000_000, "b"), userRec(3_000_000_000, "a")),
			&fedstreampb.IngestRequest{Close: true})
		if err != nil || resp.Accepted != 3 || !resp.Closed {
			t.Fatalf("ingest into %s: %+v %v", id, resp, err)
		}
	}
	for r := range 2 {
		sink := queryspec.TaskID("ing", "out", 0, r)
		got := map[string]string{}
		for _, tp := range sinkData(t, c, sink) {
			got[tp.Values[0].S] = fmt.Sprintf("n=%d total=%d end=%d", tp.Values[1].I, tp.Values[2].I, tp.Values[3].I)
		}
		want := map[string]string{"a": "n=2 total=2 end=60000000000", "b": "n=1 total=1 end=60000000000"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("sink %s: %v, want %v", sink, got, want)
		}
	}
	// Lines after the close are refused as a whole; a second close is fine.
	_, err := ingestReqs(t, c, c.addrOf(src[0]), linesReq(4, userRec(4_000_000_000, "late")))
	if err == nil || !strings.Contains(err.Error(), "FailedPrecondition") || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("ingest after close: %v", err)
	}
	resp, err := ingestReqs(t, c, c.addrOf(src[0]), &fedstreampb.IngestRequest{Query: "ing", Source: "events", Close: true})
	if err != nil || !resp.Closed {
		t.Fatalf("second close: %+v %v", resp, err)
	}
	for _, st := range c.states() {
		if st.TaskID == src[0] && st.Message != "input closed" {
			t.Errorf("closed source state %+v", st)
		}
	}
	_ = math.MaxInt64
}
