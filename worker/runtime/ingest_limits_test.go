package runtime

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// ingestOnce sends lines (numbered from 1) in one request and returns the
// response.
func ingestOnce(t *testing.T, c *cluster, lines ...string) *fedstreampb.IngestResponse {
	t.Helper()
	conn, err := c.pool.Conn(c.workers[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Ingest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.IngestRequest{Query: "ing", Source: "events", FirstLine: 1, Lines: []byte(strings.Join(lines, "\n"))}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatalf("ingest: %v", err)
	}
	return resp
}

// One bad record never closes the source: a record at the engine's
// end-of-stream marker, at its no-time marker or dated far ahead of the
// source's time is refused on its own line, and the records after it
// (and the next client's) are accepted, not refused as late.
func TestIngestRefusesMarkersAndFarFuture(t *testing.T) {
	c := newCluster(t, 1, ingestQuery, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	now := time.Now().UnixNano()
	rec := func(ns int64, user string) string {
		return fmt.Sprintf(`{"time": %d, "user": %q, "amount": 1}`, ns, user)
	}
	resp := ingestOnce(t, c,
		rec(now, "a"),
		rec(math.MaxInt64, "end-marker"),
		rec(math.MinInt64, "no-time-marker"),
		`{"time": "2200-01-01T00:00:00Z", "user": "typo", "amount": 1}`,
		rec(now+int64(time.Minute), "b"),
	)
	if resp.Accepted != 2 || len(resp.Errors) != 3 {
		t.Fatalf("accepted %d, errors %+v; want a and b accepted and 3 refused", resp.Accepted, resp.Errors)
	}
	for i, want := range []string{"end-of-stream marker", "no-time marker", "ahead of the source's time"} {
		if e := resp.Errors[i]; e.Line != uint64(i+2) || !strings.Contains(e.Error, want) {
			t.Errorf("error %d = %+v, want line %d saying %q", i, e, i+2, want)
		}
	}
	if !strings.Contains(resp.Errors[2].Error, "max-future") {
		t.Errorf("far-future error does not name the setting: %s", resp.Errors[2].Error)
	}
	// The next client is not refused as late.
	resp = ingestOnce(t, c, rec(now+int64(2*time.Minute), "c"))
	if resp.Accepted != 1 || len(resp.Errors) != 0 {
		t.Fatalf("next client: %+v", resp)
	}
	// Replaying older data advances the source's time with the data: a
	// record an hour past the newest accepted one, within max-future.
	resp = ingestOnce(t, c, rec(now+int64(50*time.Minute), "d"), rec(now+int64(100*time.Minute), "e"))
	if resp.Accepted != 2 {
		t.Fatalf("stepping forward within max-future: %+v", resp)
	}
}

// Binary input is refused line by line with escaped excerpts; the call
// succeeds (a raw byte in an error used to fail the whole response's
// marshalling).
func TestIngestBinaryLines(t *testing.T) {
	c := newCluster(t, 1, ingestQuery, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	resp := ingestOnce(t, c,
		"\x00\xff\xfe binary",
		"9\xc3\x28\x01",
		fmt.Sprintf(`{"time": %d, "user": "ok", "amount": 1}`, time.Now().UnixNano()),
	)
	if resp.Accepted != 1 || len(resp.Errors) != 2 {
		t.Fatalf("response %+v", resp)
	}
	for _, e := range resp.Errors {
		if !utf8.ValidString(e.Error) {
			t.Fatalf("line %d: message is not valid UTF-8: %q", e.Line, e.Error)
		}
	}
}
