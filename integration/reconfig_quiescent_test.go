package integration

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestQuiescentReconfiguration runs the comparison baseline through the
// coordinator: `query update --strategy quiescent` while tuples flow (one
// coordinator, two workers, mutual TLS, two replicas). The sources hold
// at the plan's cut until every task has the markers (the stream drains,
// the old versions are removed), then resume under the new versions:
// the plan completes, every output names one consistent set of versions,
// nothing is lost or duplicated against the generators' reference, and
// the two sink replicas agree tuple for tuple (they held at the same
// place).
func TestQuiescentReconfiguration(t *testing.T) {
	t.Parallel()
	const limit = 4000
	o := newLiveOrg(t, 2)
	base := fmt.Sprintf(reconfigQuery, limit)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(base), Filename: "rq.yaml"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	started := false
	out0 := o.tailRaw(t, "rq/out/p0/r0", func(n int) {
		if n <= 300 || started {
			return
		}
		started = true
		go func() {
			resp, err := o.reconfig.UpdateQuery(context.Background(), &pb.UpdateQueryRequest{Yaml: []byte(reconfigVersion(base, 2)),
				Filename: "rq.yaml", Strategy: "quiescent"})
			if err != nil {
				done <- err.Error()
				return
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				vs, err := o.reconfig.QueryVersions(context.Background(), &pb.QueryVersionsRequest{Name: "rq"})
				if err == nil && len(vs.Plans) >= int(resp.Epoch) && vs.Plans[resp.Epoch-1].Phase == "complete" {
					if s := vs.Plans[resp.Epoch-1].Strategy; s != "quiescent" {
						done <- "strategy " + s
						return
					}
					done <- ""
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			done <- "plan not complete"
		}()
	})
	if msg := <-done; msg != "" {
		t.Fatal(msg)
	}
	out1 := o.tailRaw(t, "rq/out/p0/r1", nil)

	var want []string
	for p := range 2 {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 5, Limit: limit, Rate: 2000}, p)
		if err != nil {
			t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			want = append(want, tp.Values[0].S)
		}
	}
	var got []string
	paths := map[string]int{}
	held := false
	for _, tp := range out0 {
		// Held sources step their boundaries one nanosecond past their
		// marker (boundaries are otherwise multiples of 5 ms).
		if tp.Type == tuple.Boundary && tp.STime != math.MaxInt64 && tp.STime%int64(5*time.Millisecond) != 0 {
			held = true
		}
		if !tp.Type.IsData() {
			continue
		}
		path := tp.Values[2].S
		if path != fmt.Sprintf("v%d", tp.Version+1) {
			t.Fatalf("tuple %d: path %s, version tag %d", tp.ID, path, tp.Version)
		}
		if tp.Type != tuple.Stable {
			continue // see stableResults
		}
		paths[path]++
		got = append(got, tp.Values[0].S)
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("%d results, the generators made %d: lost or duplicated", len(got), len(want))
	}
	if !held {
		t.Fatal("no source held at the cut")
	}
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("paths %v: the upgrade did not happen mid-stream", paths)
	}
	sameReplicaResults(t, out0, out1)
	t.Logf("paths %v", paths)
}
