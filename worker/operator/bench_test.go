package operator

import (
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// discard is an Emitter that drops everything, so benchmarks measure the
// operator alone.
type discard struct{ n int }

func (d *discard) Emit(*tuple.Tuple) { d.n++ }

// benchTuples is a small ring of inputs with varying values; the benchmark
// copies each into one reused tuple, as a task decoding batches would.
func benchTuples() []*tuple.Tuple {
	srcs := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
	out := make([]*tuple.Tuple, 1024)
	for i := range out {
		out[i] = conn(int64(i), srcs[i%len(srcs)], int64(i*37%2000), float64(i%17)/4, i%3 == 0)
	}
	return out
}

func benchOperator(b *testing.B, def *queryspec.Operator, advanceEvery int) {
	op, err := New(def, []*tuple.Schema{connSchema})
	if err != nil {
		b.Fatal(err)
	}
	inputs := benchTuples()
	var out discard
	var cur tuple.Tuple
	cur.Values = make([]tuple.Value, connSchema.Len())
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		src := inputs[i%len(inputs)]
		cur.Type = src.Type
		cur.STime = int64(i)
		copy(cur.Values, src.Values)
		cur.Values[0] = tuple.Timestamp(int64(i))
		if err := op.Process(0, &cur, &out); err != nil {
			b.Fatal(err)
		}
		if advanceEvery > 0 && i%advanceEvery == advanceEvery-1 {
			if err := op.Advance(int64(i), &out); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkFilter(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "f", Type: "filter", Where: "port > 100 && ok"}, 0)
}

func BenchmarkFilterString(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "f", Type: "filter", Where: `src != "10.0.0.3" && load < 3.0`}, 0)
}

// BenchmarkFilterVM uses expressions outside the fast subset, so the
// expression VM runs.
func BenchmarkFilterVM(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "f", Type: "filter", Where: `port % 7 == 0 || src in ["10.0.0.1"]`}, 0)
}

func BenchmarkMapVM(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "m", Type: "map", Fields: queryspec.Exprs{
		{Name: "m", Expr: "port % 7"}, {Name: "n", Expr: "len(src)"},
	}}, 0)
}

func BenchmarkMap(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "m", Type: "map", Fields: queryspec.Exprs{
		{Name: "t", Expr: "time"}, {Name: "src", Expr: "src"}, {Name: "web", Expr: "port == 80 || port == 443"}, {Name: "heavy", Expr: "load > 2.5"},
	}}, 0)
}

func BenchmarkMapArithmetic(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "m", Type: "map", Fields: queryspec.Exprs{
		{Name: "p2", Expr: "port * 2"}, {Name: "l", Expr: "load + 1.0"},
	}}, 0)
}

func BenchmarkAggregate(b *testing.B) {
	benchOperator(b, aggDef("1us", "", []string{"src"}, "n=count()", "s=sum(port)", "a=avg(load)", "hi=max(port)"), 100)
}

func BenchmarkAggregateCountDistinct(b *testing.B) {
	benchOperator(b, aggDef("1us", "", []string{"src"}, "n=count()", "d=count_distinct(port)"), 100)
}

func BenchmarkAggregateSliding(b *testing.B) {
	benchOperator(b, aggDef("1us", "250ns", []string{"src"}, "n=count()", "s=sum(port)"), 100)
}

func BenchmarkJoin(b *testing.B) {
	op, err := New(joinDef("1us", "src"), []*tuple.Schema{busySchema, probeSchema})
	if err != nil {
		b.Fatal(err)
	}
	srcs := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var out discard
	l := busy(0, "", 1)
	r := probe(0, "", 1, 2)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t := l
		if i%2 == 1 {
			t = r
		}
		t.STime = int64(i)
		t.Values[0] = tuple.Str(srcs[i%len(srcs)])
		if err := op.Process(i%2, t, &out); err != nil {
			b.Fatal(err)
		}
		if i%100 == 99 {
			if err := op.Advance(int64(i), &out); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchSplit splits word-count lines (as the words generator makes them:
// 5..15 words, single spaces) copied into one reused tuple, and reports the
// cost per token as well as per input tuple.
func benchSplit(b *testing.B, lower bool, transform func(string) string) {
	schema := tuple.NewSchema([]tuple.Field{{Name: "line", Kind: tuple.KindString}})
	op, err := New(&queryspec.Operator{Name: "tok", Type: "split", Field: "line", Lower: lower}, []*tuple.Schema{schema})
	if err != nil {
		b.Fatal(err)
	}
	vocab := []string{"the", "of", "and", "stream", "window", "replica", "tentative", "a", "coordinator", "in", "raft", "worker"}
	lines := make([]string, 256)
	for i := range lines {
		words := make([]string, 5+i%11)
		for j := range words {
			words[j] = vocab[(i*7+j*j)%len(vocab)]
		}
		lines[i] = transform(strings.Join(words, " "))
	}
	var out discard
	cur := tuple.Tuple{Type: tuple.Stable, Values: make([]tuple.Value, 1)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		cur.STime = int64(i)
		cur.Values[0] = tuple.Str(lines[i%len(lines)])
		if err := op.Process(0, &cur, &out); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if out.n > 0 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(out.n), "ns/token")
	}
}

func BenchmarkSplit(b *testing.B) { benchSplit(b, false, func(s string) string { return s }) }

// BenchmarkSplitLower: lower-case input, so lowering is a scan, not a copy.
func BenchmarkSplitLower(b *testing.B) { benchSplit(b, true, func(s string) string { return s }) }

// BenchmarkSplitLowerMixedCase: one lowered copy of each line.
func BenchmarkSplitLowerMixedCase(b *testing.B) { benchSplit(b, true, strings.ToUpper) }

// BenchmarkSplitUnicode: non-ASCII text takes the decoding path.
func BenchmarkSplitUnicode(b *testing.B) {
	benchSplit(b, false, func(s string) string { return strings.ReplaceAll(s, "a", "ä") + "\u00a0café" })
}

// BenchmarkMapProjection: every output is an input field (the forward
// benchmark's shape), the projection fast path.
func BenchmarkMapProjection(b *testing.B) {
	benchOperator(b, &queryspec.Operator{Name: "m", Type: "map", Fields: queryspec.Exprs{
		{Name: "src", Expr: "src"}, {Name: "port", Expr: "port"},
	}}, 0)
}
