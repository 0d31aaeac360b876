package source

import (
	"math/rand/v2"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// blobWindows is the number of distinct payloads a blob generator cycles
// through (a power of two, so picking one is a mask).
const blobWindows = 4096

// blobAlphabet is what payloads are made of: printable, so that tailing a
// blob source shows something readable.
const blobAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// blob produces fixed-size records (seq, payload) for throughput tests.
// Payloads are windows of one pseudo-random string built once from the
// seed: record n carries pool[o:o+size] with o drawn from the seeded
// generator. Next therefore only draws a number and slices a string; it
// never allocates, and the payload's bytes are not touched per record.
type blob struct {
	clock
	schema *tuple.Schema
	rng    *rand.Rand
	size   int
	// pool holds blobWindows+size-1 bytes, so that every window of size
	// bytes starting below blobWindows lies inside it.
	pool string
}

func newBlob(c clock, schema *tuple.Schema, rng *rand.Rand, size int) *blob {
	if size <= 0 {
		size = queryspec.DefaultBlobSize
	}
	pool := make([]byte, blobWindows+size-1)
	for i := range pool {
		pool[i] = blobAlphabet[rng.IntN(len(blobAlphabet))]
	}
	return &blob{clock: c, schema: schema, rng: rng, size: size, pool: string(pool)}
}

func (g *blob) Schema() *tuple.Schema { return g.schema }

func (g *blob) Next(t *tuple.Tuple) bool {
	n, stime, ok := g.tick()
	if !ok {
		return false
	}
	off := int(g.rng.Uint64() & (blobWindows - 1))
	t.STime = stime
	if len(t.Values) != 2 || t.Values[0].Kind != tuple.KindInt || t.Values[1].Kind != tuple.KindString {
		t.Values = append(t.Values[:0], tuple.Int(n), tuple.Str(""))
	}
	// Only what changes is written: the number and the payload's string.
	t.Values[0].I = n
	t.Values[1].S = g.pool[off : off+g.size]
	return true
}
