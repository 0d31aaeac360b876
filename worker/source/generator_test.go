package source

import (
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

func collect(t *testing.T, g Generator, n int) []tuple.Tuple {
	t.Helper()
	out := make([]tuple.Tuple, 0, n)
	var tp tuple.Tuple
	for i := 0; i < n; i++ {
		if !g.Next(&tp) {
			t.Fatalf("generator stopped after %d records", i)
		}
		out = append(out, tuple.Tuple{STime: tp.STime, Values: append([]tuple.Value(nil), tp.Values...)})
	}
	return out
}

func mustGen(t *testing.T, def queryspec.Generator, partition int) Generator {
	t.Helper()
	g, err := NewGenerator(&def, partition)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGeneratorsDeterministic(t *testing.T) {
	for _, kind := range []string{"netmon", "words", "vitals", "blob"} {
		t.Run(kind, func(t *testing.T) {
			def := queryspec.Generator{Kind: kind, Rate: 1000, Seed: 99, Monitors: 3}
			a := collect(t, mustGen(t, def, 0), 10000)
			b := collect(t, mustGen(t, def, 0), 10000)
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed and partition produced different records")
			}
			c := collect(t, mustGen(t, def, 1), 10000)
			if reflect.DeepEqual(a, c) {
				t.Error("partitions 0 and 1 produced identical records")
			}
			def.Seed++
			d := collect(t, mustGen(t, def, 0), 10000)
			if reflect.DeepEqual(a, d) {
				t.Error("different seeds produced identical records")
			}
			schema := mustGen(t, def, 0).Schema()
			for i, r := range a {
				if len(r.Values) != schema.Len() {
					t.Fatalf("record %d has %d values, schema %d", i, len(r.Values), schema.Len())
				}
				for j, v := range r.Values {
					if v.Kind != schema.Fields[j].Kind {
						t.Fatalf("record %d field %s: kind %v, want %v", i, schema.Fields[j].Name, v.Kind, schema.Fields[j].Kind)
					}
				}
			}
		})
	}
}

func TestGeneratorSTime(t *testing.T) {
	for _, c := range []struct {
		rate  int
		start string
		n     int64
		want  int64
	}{
		{1000, "", 0, 0},
		{1000, "", 1, 1_000_000},
		{1000, "", 2500, 2_500_000_000},
		{3, "", 1, 333_333_333},
		{3, "", 4, 1_333_333_333},
		{0, "", 7, 7_000}, // logical rate: 1µs per record
		{1, "2024-01-01T00:00:00Z", 2, 1704067200_000_000_000 + 2_000_000_000},
	} {
		g := mustGen(t, queryspec.Generator{Kind: "words", Rate: c.rate, Start: c.start}, 0)
		var tp tuple.Tuple
		for i := int64(0); i <= c.n; i++ {
			g.Next(&tp)
		}
		if tp.STime != c.want {
			t.Errorf("rate %d start %q record %d: stime %d, want %d", c.rate, c.start, c.n, tp.STime, c.want)
		}
	}
	// Large record numbers must not overflow n*1e9.
	var c clock
	c.rate, c.n = 1000, 10_000_000_000 // n*1e9 would overflow int64
	if _, st, _ := c.tick(); st != 10_000_000_000*1_000_000 {
		t.Errorf("overflowed: %d", st)
	}
}

func TestGeneratorLimit(t *testing.T) {
	g := mustGen(t, queryspec.Generator{Kind: "vitals", Limit: 5}, 0)
	var tp tuple.Tuple
	n := 0
	for g.Next(&tp) {
		n++
	}
	if n != 5 {
		t.Errorf("produced %d records, want 5", n)
	}
	if g.Next(&tp) {
		t.Error("Next after the limit should stay false")
	}
}

func TestNewGeneratorErrors(t *testing.T) {
	if _, err := NewGenerator(&queryspec.Generator{Kind: "nope"}, 0); !errors.Is(err, ErrUnknownGenerator) {
		t.Errorf("unknown kind: %v", err)
	}
	if _, err := NewGenerator(nil, 0); err == nil {
		t.Error("nil definition should fail")
	}
	if _, err := NewGenerator(&queryspec.Generator{Kind: "words", Rate: -1}, 0); err == nil {
		t.Error("negative rate should fail")
	}
	if _, err := NewGenerator(&queryspec.Generator{Kind: "words", Start: "soon"}, 0); err == nil {
		t.Error("bad start should fail")
	}
	for _, size := range []int{-1, queryspec.MaxBlobSize + 1} {
		if _, err := NewGenerator(&queryspec.Generator{Kind: "blob", Size: size}, 0); err == nil {
			t.Errorf("blob size %d should fail", size)
		}
	}
	if _, err := GeneratorSchema("nope"); !errors.Is(err, ErrUnknownGenerator) {
		t.Errorf("GeneratorSchema(nope): %v", err)
	}
	s, err := GeneratorSchema("netmon")
	if err != nil || len(s) != 4 || s[0].Name != "time" {
		t.Errorf("GeneratorSchema(netmon) = %v, %v", s, err)
	}
}

func TestNetmonMonitorsInterleaved(t *testing.T) {
	recs := collect(t, mustGen(t, queryspec.Generator{Kind: "netmon", Monitors: 3, Seed: 1}, 0), 300)
	for i, r := range recs {
		want := "10." + string(rune('1'+i%3)) + "."
		if !strings.HasPrefix(r.Values[2].S, want) {
			t.Fatalf("record %d dst %s, want monitor subnet %s*", i, r.Values[2].S, want)
		}
		if r.Values[0].I != r.STime {
			t.Fatalf("record %d: time field %d != stime %d", i, r.Values[0].I, r.STime)
		}
	}
}

// TestNetmonAlerts evaluates the examples/netmon.yaml query by hand over
// one 60 s window: per src count() > 100 and count_distinct(port) > 10 must
// flag exactly the scanners.
func TestNetmonAlerts(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "netmon.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	q, err := queryspec.Parse("netmon.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	def := q.Sources[0].Gen
	g, err := NewGenerator(def, 0)
	if err != nil {
		t.Fatal(err)
	}
	const window = int64(60e9)
	conns := map[string]int{}
	ports := map[string]map[int64]bool{}
	var tp tuple.Tuple
	for g.Next(&tp) && tp.STime < window {
		src := tp.Values[1].S
		conns[src]++
		if ports[src] == nil {
			ports[src] = map[int64]bool{}
		}
		ports[src][tp.Values[3].I] = true
	}
	var busy, probing, both []string
	for src, n := range conns {
		if n > 100 {
			busy = append(busy, src)
		}
		if len(ports[src]) > 10 {
			probing = append(probing, src)
			if n > 100 {
				both = append(both, src)
			}
		}
	}
	scanners := g.(*netmon).Scanners()
	if len(both) != len(scanners) {
		t.Fatalf("alerts for %v, want exactly the scanners %v (busy %d, probing %d)", both, scanners, len(busy), len(probing))
	}
	for _, s := range scanners {
		if conns[s] <= 100 || len(ports[s]) <= 10 {
			t.Errorf("scanner %s: %d conns, %d ports", s, conns[s], len(ports[s]))
		}
	}
}

func TestWordsLines(t *testing.T) {
	if len(vocabulary) < 900 {
		t.Fatalf("vocabulary has %d words, want about 1000", len(vocabulary))
	}
	recs := collect(t, mustGen(t, queryspec.Generator{Kind: "words", Seed: 3}, 0), 5000)
	freq := map[string]int{}
	for _, r := range recs {
		ws := strings.Fields(r.Values[0].S)
		if len(ws) < 5 || len(ws) > 15 {
			t.Fatalf("line with %d words: %q", len(ws), r.Values[0].S)
		}
		for _, w := range ws {
			freq[w]++
		}
	}
	// Zipf-like: the most common word is far more frequent than the median one.
	if freq["the"] < 20*freq[vocabulary[len(vocabulary)/2]]+1 {
		t.Errorf("distribution not skewed: the=%d, median word=%d", freq["the"], freq[vocabulary[len(vocabulary)/2]])
	}
	if len(freq) < 300 {
		t.Errorf("only %d distinct words used", len(freq))
	}
}

func TestVitalsEpisodes(t *testing.T) {
	g := mustGen(t, queryspec.Generator{Kind: "vitals", Rate: 50, Seed: 1}, 0)
	var tp tuple.Tuple
	fever, patients := 0, map[string]bool{}
	for i := 0; i < 50*600; i++ { // ten minutes
		g.Next(&tp)
		patients[tp.Values[1].S] = true
		if tp.Values[2].F >= 38.5 {
			fever++
		}
		if hr := tp.Values[3].I; hr < 30 || hr > 200 {
			t.Fatalf("implausible heart rate %d", hr)
		}
	}
	if len(patients) != vitalsPatients {
		t.Errorf("%d patients, want %d", len(patients), vitalsPatients)
	}
	if fever == 0 {
		t.Error("no fever reading in ten minutes: the vitals example would never alert")
	}
	if fever > 50*600/4 {
		t.Errorf("%d fever readings: too many to be interesting", fever)
	}
}

func TestNextDoesNotAllocate(t *testing.T) {
	for _, kind := range []string{"netmon", "vitals", "blob"} {
		g := mustGen(t, queryspec.Generator{Kind: kind, Monitors: 2}, 0)
		var tp tuple.Tuple
		g.Next(&tp)
		g.Next(&tp) // both netmon monitors' subnets built
		if a := testing.AllocsPerRun(1000, func() { g.Next(&tp) }); a != 0 {
			t.Errorf("%s: %.1f allocations per record, want 0", kind, a)
		}
	}
	g := mustGen(t, queryspec.Generator{Kind: "words"}, 0)
	var tp tuple.Tuple
	g.Next(&tp)
	if a := testing.AllocsPerRun(1000, func() { g.Next(&tp) }); a > 1 {
		t.Errorf("words: %.1f allocations per record, want at most 1 (the line)", a)
	}
}

func BenchmarkGenerators(b *testing.B) {
	for _, kind := range []string{"netmon", "words", "vitals", "blob"} {
		b.Run(kind, func(b *testing.B) {
			g, _ := NewGenerator(&queryspec.Generator{Kind: kind, Monitors: 3}, 0)
			var tp tuple.Tuple
			b.ReportAllocs()
			for b.Loop() {
				g.Next(&tp)
			}
		})
	}
}

func TestBlobRecords(t *testing.T) {
	for _, c := range []struct {
		size, want int // configured size (0: default), payload length
	}{
		{0, queryspec.DefaultBlobSize},
		{1, 1},
		{200, 200},
		{queryspec.MaxBlobSize, queryspec.MaxBlobSize},
	} {
		recs := collect(t, mustGen(t, queryspec.Generator{Kind: "blob", Seed: 5, Size: c.size}, 0), 2000)
		distinct := map[string]bool{}
		for i, r := range recs {
			if r.Values[0].I != int64(i) {
				t.Fatalf("size %d: record %d has seq %d", c.size, i, r.Values[0].I)
			}
			p := r.Values[1].S
			if len(p) != c.want {
				t.Fatalf("size %d: record %d payload is %d bytes, want %d", c.size, i, len(p), c.want)
			}
			if strings.Trim(p, blobAlphabet) != "" {
				t.Fatalf("size %d: record %d payload %q has bytes outside the alphabet", c.size, i, p)
			}
			distinct[p] = true
		}
		if c.want > 8 && len(distinct) < 1000 {
			t.Errorf("size %d: only %d distinct payloads in 2000 records", c.size, len(distinct))
		}
	}
}

// TestBlobEncodedSize: with the default size, a record as the engine
// encodes it (the source numbers tuples from 1) is 100 bytes, the raw TCP
// baseline's record, over the range of record numbers a benchmark covers.
func TestBlobEncodedSize(t *testing.T) {
	g := mustGen(t, queryspec.Generator{Kind: "blob"}, 0).(*blob)
	var tp tuple.Tuple
	for _, n := range []int64{3_000_000, 10_000_000, 16_000_000} {
		g.clock.n = n
		g.Next(&tp)
		tp.Type, tp.ID = tuple.Stable, uint64(n+1)
		if got := tuple.EncodedSize(&tp); got != 100 {
			t.Errorf("record %d encodes to %d bytes, want 100", n, got)
		}
	}
}

// TestZipfIndexMatchesSearch: the guided draw picks exactly the word a
// binary search over the CDF picks, so the words stream never changes.
func TestZipfIndexMatchesSearch(t *testing.T) {
	us := []float64{0, math.SmallestNonzeroFloat64, 0.5, math.Nextafter(1, 0)}
	for _, c := range zipfCDF {
		us = append(us, c, math.Nextafter(c, 0), math.Nextafter(c, 1))
	}
	for j := range zipfGuideSize {
		b := float64(j) / zipfGuideSize
		us = append(us, b, math.Nextafter(b, 0), math.Nextafter(b, 1))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		us = append(us, rng.Float64())
	}
	for _, u := range us {
		if u < 0 || u >= 1 {
			continue
		}
		want := min(sort.SearchFloat64s(zipfCDF, u), len(zipfCDF)-1)
		if got := zipfIndex(u); got != want {
			t.Fatalf("zipfIndex(%v) = %d, want %d", u, got, want)
		}
	}
}

// TestWordsStreamUnchanged pins the words generator's output (seed 42,
// partition 0, first 100,000 lines, FNV-1a over the lines each followed by
// a newline): queries, examples and benchmarks depend on it.
func TestWordsStreamUnchanged(t *testing.T) {
	g := mustGen(t, queryspec.Generator{Kind: "words", Seed: 42}, 0)
	var tp tuple.Tuple
	h := fnv.New64a()
	for i := range 100_000 {
		if !g.Next(&tp) {
			t.Fatalf("stopped after %d lines", i)
		}
		if i == 0 && tp.Values[0].S != "the the off master grow a will them is that other was" {
			t.Errorf("first line %q", tp.Values[0].S)
		}
		h.Write([]byte(tp.Values[0].S))
		h.Write([]byte{'\n'})
	}
	if got := h.Sum64(); got != 0xf94c2506e3129012 {
		t.Errorf("words stream changed: hash %#x, want 0xf94c2506e3129012", got)
	}
}

// TestClockMatchesFormula: the incremental clock gives every record the
// stime of the closed formula, across second boundaries, for rates that do
// and do not divide a second, and after its position is set directly.
func TestClockMatchesFormula(t *testing.T) {
	for _, rate := range []int64{1, 3, 7, 1000, 999_983, 1_000_000, 3_000_000_000} {
		c := clock{start: 1_700_000_000_000_000_000, rate: rate}
		check := func(count int) {
			for range count {
				want := c.n
				n, stime, ok := c.tick()
				if !ok || n != want {
					t.Fatalf("rate %d: tick = %d, %v; want record %d", rate, n, ok, want)
				}
				if f := c.start + (n/rate)*1e9 + (n%rate)*1e9/rate; stime != f {
					t.Fatalf("rate %d record %d: stime %d, formula %d", rate, n, stime, f)
				}
			}
		}
		check(int(min(3*rate+5, 20_000)))
		c.n = 5*rate - 2
		check(10)
	}
}
