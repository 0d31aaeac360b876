package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// scaleQuery is moveQuery's keyed aggregate starting with one partition
// and paced slower, so that two rescales happen mid-stream.
const scaleQuery = `
name: %s
replicas: %d
sources:
  - name: lines
    generator: {kind: words, seed: 42, limit: 30000, rate: 5000}
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
    parallelism: %d
sinks:
  - {name: out, input: counts}
`

func (o *liveOrg) submitScale(t *testing.T, name string, replicas, parallelism int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(scaleQuery, name, replicas, parallelism)), Filename: name + ".yaml"}); err != nil {
		t.Fatal(err)
	}
}

// TestLiveRescale rescales the keyed aggregate of a running query 1 -> 4
// -> 2 partitions with AdminService.ScaleQuery over mutual TLS (slots
// handed over between workers with FetchSlots), with one and with two
// replicas. The sink's results equal, window by window and word by word,
// those of the same query run with two partitions and left alone.
func TestLiveRescale(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) { liveRescale(t, replicas) })
	}
}

func liveRescale(t *testing.T, replicas int) {
	// The default heartbeat TTL (moveTestTTL): with the harness's 1 s, a
	// loaded machine (20-35) had a live worker declared down, its tasks
	// placed again without state (with one replica, nothing to start
	// from), and the sink named the results lost from the start of the
	// stream ("[-inf, ...)"): a real loss, but not of a rescale.
	o := newLiveOrgWith(t, 3, moveTestTTL)
	o.submitScale(t, "ref", replicas, 2)
	want := o.results(t, "ref", nil)

	o.submitScale(t, "sc", replicas, 1)
	steps := []int{4, 2}
	// The tail's callback starts each rescale in turn once enough results
	// came, without waiting for it: results keep flowing meanwhile.
	var (
		mu      sync.Mutex
		started int
		busy    bool
		maps    []*pb.ScaleQueryResponse
		errs    []error
	)
	got := o.results(t, "sc", func(n int) {
		mu.Lock()
		defer mu.Unlock()
		// The first once results flow, the next as soon as the one
		// before has finished: as much of the stream as possible is left
		// for each.
		if busy || started == len(steps) || n < 150 {
			return
		}
		busy = true
		p, epoch := steps[started], uint64(started+2)
		started++
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := o.admin.ScaleQuery(ctx, &pb.ScaleQueryRequest{Query: "sc", Operator: "counts", Parallelism: int32(p)})
			if err == nil && (int(resp.Partitions) != p || resp.Epoch != epoch || len(resp.Ranges) != p) {
				err = fmt.Errorf("scale to %d answered %+v", p, resp)
			}
			mu.Lock()
			defer mu.Unlock()
			maps, errs, busy = append(maps, resp), append(errs, err), false
		}()
	})
	waitFor(t, 60*time.Second, "the rescales end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !busy
	})
	mu.Lock()
	defer mu.Unlock()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if started != len(steps) {
		t.Fatalf("the query ended after %d of %d rescales: the test would prove nothing", started, len(steps))
	}
	sameResultMaps(t, got, want)
	tasks := o.query(t, "sc").Tasks
	counts := 0
	for _, ti := range tasks {
		if strings.HasPrefix(ti.TaskId, "sc/counts/") {
			counts++
		}
	}
	if counts != 2*replicas {
		t.Fatalf("%d tasks of counts after scaling to 2 partitions, want %d", counts, 2*replicas)
	}
	if maps[1].Cut <= maps[0].Cut {
		t.Fatalf("cuts %d then %d", maps[0].Cut, maps[1].Cut)
	}
	ctx := context.Background()
	// A generator source rescales live unless a replicated operator reads
	// it (that operator's DCAA machine has fixed inputs). The query's
	// finite source may have ended by now, which is refused as such.
	_, err := o.admin.ScaleQuery(ctx, &pb.ScaleQueryRequest{Query: "sc", Operator: "lines", Parallelism: 2})
	switch {
	case replicas == 1 && err != nil && !strings.Contains(err.Error(), "released the end of its stream"):
		t.Errorf("scaling the generator source: %v", err)
	case replicas > 1 && err == nil:
		t.Error("scaling a source read by a replicated operator was accepted")
	}
	if _, err := o.admin.ScaleQuery(ctx, &pb.ScaleQueryRequest{Query: "sc", Operator: "counts", Parallelism: 0}); err == nil {
		t.Error("scaling to 0 partitions was accepted")
	}
}

// TestQueryScaleCommand rescales the running ward query's keyed aggregate
// 1 -> 4 -> 2 partitions (two replicas each) with `fedstream query scale
// --json` between worker processes while the CLI tail reads: every result
// equals the reference, once, and the command prints the new slot map.
func TestQueryScaleCommand(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	query := strings.Replace(pacedWard, "parallelism: 2", "parallelism: 1", 1)
	want := wardReference(t, query, 100*time.Millisecond)
	o := startOrg(t, 1, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	w := startWardQuery(ctx, t, o, query)
	type slotRange struct {
		First, Last, Partition int
	}
	type scaleJSON struct {
		Query       string      `json:"query"`
		Fragment    string      `json:"fragment"`
		Epoch       int         `json:"epoch"`
		Partitions  int         `json:"partitions"`
		Cut         int64       `json:"cut"`
		Ranges      []slotRange `json:"ranges"`
		ByPartition []struct {
			Partition int         `json:"partition"`
			Ranges    []slotRange `json:"ranges"`
		} `json:"by_partition"`
	}
	var res []scaleJSON
	steps := []int{4, 2}
	got := w.results(t, len(want), func(n int) {
		// The first once a sixth of the results came, the next right
		// after it: as much of the stream as possible is left for each.
		if len(res) == len(steps) || n < len(want)/6 {
			return
		}
		res = append(res, scaleJSON{})
		if err := cli(ctx, t, &res[len(res)-1], "query", "scale", "ward", "--operator", "per_patient",
			"--parallelism", fmt.Sprint(steps[len(res)-1]), "--json", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
			t.Fatal(err)
		}
	})
	if len(res) != len(steps) {
		t.Fatalf("the query ended after %d of %d rescales: the test would prove nothing", len(res), len(steps))
	}
	sameWard(t, got, want)
	for i, r := range res {
		if r.Query != "ward" || r.Fragment != "per_patient" || r.Epoch != i+2 || r.Partitions != steps[i] || len(r.ByPartition) != steps[i] {
			t.Fatalf("query scale --json printed %+v", r)
		}
		next := 0
		for _, sr := range r.Ranges {
			if sr.First != next || sr.Partition < 0 || sr.Partition >= steps[i] {
				t.Fatalf("slot ranges %+v do not cover the slots in order", r.Ranges)
			}
			next = sr.Last + 1
		}
		if next != 4096 {
			t.Fatalf("slot ranges %+v end at %d", r.Ranges, next)
		}
	}
	if res[1].Cut <= res[0].Cut {
		t.Fatalf("cuts %d then %d", res[0].Cut, res[1].Cut)
	}
	tasks := w.tasks(t)
	for id := range tasks {
		if strings.HasPrefix(id, "ward/per_patient/p2/") || strings.HasPrefix(id, "ward/per_patient/p3/") {
			t.Fatalf("task %s of a removed partition is still there", id)
		}
	}
	if _, ok := tasks["ward/per_patient/p1/r1"]; !ok {
		t.Fatalf("no task of partition 1 after scaling to 2: %v", tasks)
	}
}
