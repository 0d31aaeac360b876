package runtime

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// sourceReference computes the word count of the generator's partitions,
// partition p contributing the records of its stream with stime in
// [from[p], to[p]): the definition of a source rescaled at cuts.
func sourceReference(t *testing.T, rate int, from, to []int64) map[string]string {
	t.Helper()
	return windowedReference(t, rate, 20000, from, to)
}

// windowedReference is the long-sentence word count of the words
// generator's partitions 0..len(from)-1 (limit lines each), partition p
// contributing its records with stime in [from[p], to[p]).
func windowedReference(t *testing.T, rate int, limit int64, from, to []int64) map[string]string {
	t.Helper()
	type key struct {
		end  int64
		word string
	}
	cnt, total := map[key]int64{}, map[key]int64{}
	const size = int64(2 * time.Millisecond)
	for p := range from {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 42, Limit: limit, Rate: rate}, p)
		if err != nil {
			t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			if tp.STime < from[p] || tp.STime >= to[p] {
				continue
			}
			words := strings.Split(tp.Values[0].S, " ")
			if len(words) <= 7 {
				continue
			}
			k := key{(tp.STime/size + 1) * size, words[0]}
			cnt[k]++
			total[k] += int64(len(words))
		}
	}
	ref := map[string]string{}
	for k, n := range cnt {
		ref[fmt.Sprintf("%d/%s", k.end, k.word)] = fmt.Sprintf("cnt=%d total=%d", n, total[k])
	}
	return ref
}

// TestRescaleGeneratorSource rescales the words source 1 -> 3 -> 2
// partitions while the query runs (the keyed aggregate reading it first
// processes its single input inline, then merges three): partition 0 is
// its whole stream, partition 1 its stream from the first cut on,
// partition 2 its stream between the two cuts. Then the copy of
// partition 1 is restarted from nothing (no snapshot): it starts again at
// the start its map records, and the aggregate resumes after what it took.
// Every window of every word equals that definition's reference, once.
func TestRescaleGeneratorSource(t *testing.T) {
	const rate = 4000
	yaml := fmt.Sprintf(wordsQuery, 1, rate)
	yaml = replaceOnce(t, yaml, "parallelism: 2", "parallelism: 1")
	c := newCluster(t, 2, yaml, func(node string, p, r int) int { return p + r })
	defer c.close(t)
	rs := &rescaler{c: c, frag: "lines", partitions: 1, epoch: 1, owner: contiguous(1), reader: "counts", starts: []int64{math.MinInt64}}
	c.apply()
	agg := queryspec.TaskID("wc", "counts", 0, 0)
	waitUntil(t, "the aggregate processed some input", func() bool {
		tk := c.workers[0].rt.task(agg)
		return tk != nil && tk.outs[0].buf.Stats().LastID > 50
	})
	if tk := c.workers[0].rt.task(agg); tk.inline() == nil {
		t.Fatal("the aggregate does not process its single input inline: the test does not test the switch to merging")
	}
	cut1 := rs.scale(t, 3)
	if tk := c.workers[0].rt.task(agg); tk.inline() != nil {
		t.Fatal("the aggregate still processes inline with three inputs")
	}
	waitUntil(t, "the added partitions produced", func() bool {
		tk := c.workers[0].rt.task(queryspec.TaskID("wc", "lines", 2, 0))
		return tk != nil && tk.genRecordsSeen() > 100
	})
	cut2 := rs.scale(t, 2)
	if cut2 <= cut1 {
		t.Fatalf("cuts %d then %d", cut1, cut2)
	}
	// Partition 1 restarted from nothing: a new generation, no snapshot.
	p1 := queryspec.TaskID("wc", "lines", 1, 0)
	pls := slices.Clone(c.specs[c.workers[0]][0].Placements)
	for j := range pls {
		if pls[j].TaskID == p1 {
			pls[j].Generation++
		}
	}
	for _, w := range c.workers {
		for i := range c.specs[w] {
			if c.specs[w][i].TaskID == p1 {
				c.specs[w][i].Generation++
			}
			c.specs[w][i].Placements = pls
		}
	}
	c.apply()
	// Without the start its map records, the new copy would replay from
	// the stream's first record: the aggregate would drop what is late
	// and the results could not tell, so look at where it starts.
	var restarted *task
	waitUntil(t, "partition 1 restarted", func() bool {
		for _, w := range c.workers {
			if tk := w.rt.task(p1); tk != nil && tk.spec.Generation == 3 {
				restarted = tk
				return true
			}
		}
		return false
	})
	if !restarted.gs.hasStart || restarted.gs.start != cut1 {
		t.Fatalf("restarted partition 1 starts at %v/%d, want the first cut %d", restarted.gs.hasStart, restarted.gs.start, cut1)
	}
	got := c.tail(t, queryspec.TaskID("wc", "out", 0, 0))
	end := int64(math.MaxInt64)
	want := sourceReference(t, rate, []int64{math.MinInt64, cut1, cut1}, []int64{end, end, cut2})
	sameResults(t, results(t, got, sinkSchema(t, c.query)), want)
	after := 0
	for _, tp := range got {
		if tp.Type.IsData() && tp.STime > cut2 {
			after++
		}
	}
	if after == 0 {
		t.Fatalf("no result after the second cut %d: the rescale did not happen under load", cut2)
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

// genRecordsSeen is how many records the generator has emitted, read
// through its output buffers (the generator goroutine owns genRecords).
func (t *task) genRecordsSeen() uint64 {
	t.outMu.RLock()
	defer t.outMu.RUnlock()
	n := uint64(0)
	for _, o := range t.outs {
		n += o.buf.Stats().LastID
	}
	return n
}
