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
// rand.Zipf but drawn by binary search over a precomputed table, which is
// about ten times faster per word.
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

func (g *words) drawWord() int {
	u := g.rng.Float64()
	i := sort.SearchFloat64s(zipfCDF, u)
	if i >= len(zipfCDF) { // u can only exceed the last entry through rounding
		i = len(zipfCDF) - 1
	}
	return i
}
