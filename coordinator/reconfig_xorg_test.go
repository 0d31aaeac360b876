package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// xorgRCQuery is xorgQuery with a map after the aggregate, fused into the
// aggregate's tasks: an upgrade of it is an upgrade of the task that
// moves.
const xorgRCQuery = `
name: %s
sources:
  - name: lines
    generator: {kind: words, seed: 7, limit: %d, rate: 20000}
operators:
  - name: firsts
    type: map
    input: lines
    fields: {word: "split(line, ' ')[0]", n: "len(split(line, ' '))"}
  - {name: long, type: filter, input: firsts, where: "n > 7"}
  - name: counts
    type: aggregate
    input: long
    window: {size: 20ms}
    group_by: [word]
    aggregates: {cnt: "count()", total: "sum(n)"}
    parallelism: 2
  - {name: shaped, type: map, input: counts, fields: {word: word, cnt: cnt, total: "total + 0", window_end: window_end}}
sinks:
  - {name: out, input: shaped}
`

// TestReconfigDuringCrossOrgMove upgrades two operators (the filter
// before the aggregate, in the source's tasks, and the map after it, in
// the aggregate's tasks) while a partition of the aggregate moves to the
// partner org: the plan is committed right after the move. The versions
// are the same computation written otherwise, so the results must equal,
// window by window, those of the query left alone; the moved copy loads
// the plan at the partner (from its assignment), the plan switches while
// the stream runs and completes, every task of both orgs at its level.
func TestReconfigDuringCrossOrgMove(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, _, contract := xorgPair(t)
	const limit = 100000
	want := xorgReference(t, limit) // xorgQuery's result: the same as xorgRCQuery's

	const query, moving = "xr", "xr/counts/p0/r0"
	yaml := fmt.Sprintf(xorgRCQuery, query, limit)
	v2 := strings.Replace(strings.Replace(yaml, `where: "n > 7"`, `where: "n >= 8"`, 1), `"total + 0"`, `"total * 1"`, 1)
	if _, err := alpha.admin(0).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(yaml), Filename: query + ".yaml"}); err != nil {
		t.Fatal(err)
	}
	rcs := pb.NewReconfigServiceClient(alpha.conn(0, alpha.tokens[1]))
	var started bool
	var seen, switchedAt atomic.Int64
	done := make(chan error, 1)
	got, tags := alpha.taggedResultsOf(t, query, yaml, func(n int) {
		seen.Store(int64(n))
		if n < 100 || started {
			return
		}
		started = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if resp, err := alpha.admin(0).MigrateTask(ctx, &pb.MigrateTaskRequest{TaskId: moving, ToOrg: "beta", Contract: contract}); err != nil || resp.Generation != 2 {
				done <- fmt.Errorf("migrate: %v %v", resp, err)
				return
			}
			if _, err := rcs.UpdateQuery(ctx, &pb.UpdateQueryRequest{Yaml: []byte(v2), Filename: query + ".yaml", SwitchMarginMs: 300}); err != nil {
				done <- fmt.Errorf("update: %w", err)
				return
			}
			for ctx.Err() == nil {
				vs, err := rcs.QueryVersions(ctx, &pb.QueryVersionsRequest{Name: query})
				if err == nil && len(vs.Plans) == 1 && vs.Plans[0].Phase != "loading" {
					switchedAt.Store(seen.Load())
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			done <- ctx.Err()
		}()
	})
	if !started {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
	if at := alpha.nodes[0].TasksAtPartners(); at[moving] != "beta" {
		t.Fatalf("tasks at partners %v: the task did not move", at)
	}
	if n := switchedAt.Load(); n >= int64(len(got)) {
		t.Fatalf("the plan switched after the last result (%d of %d): not mid-stream", n, len(got))
	}
	// The versions compute the same results, so only the tags tell the
	// configurations apart: every window before some end is tagged with
	// the old epoch, every one from it with the new (nothing of the old
	// configuration after the new one's first result). That the new one
	// reached the results is not required: a plan that switched within
	// its margin of the stream's end upgrades no result (logged). The
	// sink raises every tuple to its own level, so this sees the sink's
	// switch, not each aggregate partition's (a partition at the partner
	// tagging its rows 0 throughout passed).
	byEnd := map[int64]uint64{}
	for k, tag := range tags {
		var end int64
		if _, err := fmt.Sscanf(k, "%d/", &end); err != nil {
			t.Fatalf("result key %q: %v", k, err)
		}
		if old, ok := byEnd[end]; ok && old != tag {
			t.Fatalf("window ending %d: results tagged %d and %d", end, old, tag)
		}
		byEnd[end] = tag
	}
	ends := slices.Sorted(maps.Keys(byEnd))
	for i := 1; i < len(ends); i++ {
		if byEnd[ends[i]] < byEnd[ends[i-1]] {
			t.Fatalf("window ending %d tagged %d after window ending %d tagged %d", ends[i], byEnd[ends[i]], ends[i-1], byEnd[ends[i-1]])
		}
	}
	if first := byEnd[ends[0]]; first != 0 {
		t.Fatalf("the first results tagged %d: the plan switched before the migration", first)
	}
	if last := byEnd[ends[len(ends)-1]]; last != 1 {
		t.Logf("no result tagged with the new epoch: the plan switched within its margin of the stream's end")
	}
	waitFor(t, 30*time.Second, "the plan complete", func() bool {
		vs, err := rcs.QueryVersions(ctxT(t, 10*time.Second), &pb.QueryVersionsRequest{Name: query})
		return err == nil && len(vs.Plans) == 1 && vs.Plans[0].Phase == "complete" && vs.Plans[0].TasksAcked == vs.Plans[0].Tasks
	})
}
