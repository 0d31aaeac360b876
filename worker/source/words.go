package source

import (
	"math"
	"math/rand/v2"
	"sort"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Sentences have 5..15 words drawn from vocabulary with a Zipf distribution
// (a few words are very common, most are rare, as in real text).
const (
	wordsMinPerLine = 5
	wordsMaxPerLine = 15
	wordsZipfS      = 1.1
	wordsZipfV      = 2
)

type words struct {
	clock
	schema *tuple.Schema
	rng    *rand.Rand
	buf    []byte // reused line buffer; only the final string allocates
}

func newWords(c clock, schema *tuple.Schema, rng *rand.Rand) *words {
	return &words{clock: c, schema: schema, rng: rng,
		buf: make([]byte, 0, 256)}
}

func (g *words) Schema() *tuple.Schema { return g.schema }

func (g *words) Next(t *tuple.Tuple) bool {
	_, stime, ok := g.tick()
	if !ok {
		return false
	}
	count := wordsMinPerLine + g.rng.IntN(wordsMaxPerLine-wordsMinPerLine+1)
	g.buf = g.buf[:0]
	for i := 0; i < count; i++ {
		if i > 0 {
			g.buf = append(g.buf, ' ')
		}
		g.buf = append(g.buf, vocabulary[g.drawWord()]...)
	}
	t.STime = stime
	t.Values = append(t.Values[:0], tuple.Str(string(g.buf)))
	return true
}

// zipfCDF[k] is P(word index <= k) with weight 1/(k+v)^s, the same law as
// rand.Zipf but drawn by inverting this precomputed table, which is much
// faster per word.
var zipfCDF = func() []float64 {
	cdf := make([]float64, len(vocabulary))
	total := 0.0
	for k := range cdf {
		total += math.Pow(float64(k)+wordsZipfV, -wordsZipfS)
		cdf[k] = total
	}
	for k := range cdf {
		cdf[k] /= total
	}
	return cdf
}()

// zipfGuideSize is the number of equal slices of [0, 1) zipfGuide indexes
// (a power of two, so that u*zipfGuideSize and j/zipfGuideSize are exact).
const zipfGuideSize = 4096

// zipfGuide[j] is the smallest index k with zipfCDF[k] >= j/zipfGuideSize
// (len(zipfCDF) if none): the search for u in slice j starts there and
// ends within a few entries, since the slices are finer than all but the
// rarest words' probabilities.
var zipfGuide = func() []int {
	g := make([]int, zipfGuideSize)
	for j := range g {
		g[j] = sort.SearchFloat64s(zipfCDF, float64(j)/zipfGuideSize)
	}
	return g
}()

// drawWord draws a vocabulary index: the smallest k with zipfCDF[k] >= u
// for a uniform u, exactly what sort.SearchFloat64s(zipfCDF, u) returns
// (generated streams must not change), found through zipfGuide.
func (g *words) drawWord() int {
	return zipfIndex(g.rng.Float64())
}

func zipfIndex(u float64) int {
	i := zipfGuide[int(u*zipfGuideSize)] // u < 1, so the index is in range
	for i < len(zipfCDF) && zipfCDF[i] < u {
		i++
	}
	if i >= len(zipfCDF) { // u can only exceed the last entry through rounding
		i = len(zipfCDF) - 1
	}
	return i
}
