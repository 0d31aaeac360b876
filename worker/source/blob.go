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
// seed: record n carries pool[o:o+size] with o = mix(key+n) mod
// blobWindows, key drawn from the seeded generator and mix the splitmix64
// finaliser. Next therefore only hashes a number and slices a string (a
// couple of nanoseconds; the seeded generator itself cost five per
// record); it never allocates, and the payload's bytes are not touched
// per record.
type blob struct {
	clock
	schema *tuple.Schema
	key    uint64
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
	return &blob{clock: c, schema: schema, key: rng.Uint64(), size: size, pool: string(pool)}
}

func (g *blob) Schema() *tuple.Schema { return g.schema }

func (g *blob) Next(t *tuple.Tuple) bool {
	n, stime, ok := g.tick()
	if !ok {
		return false
	}
	off := int(splitmix(g.key+uint64(n)) & (blobWindows - 1))
	t.STime = stime
	if len(t.Values) != 2 || t.Values[0].Kind != tuple.KindInt || t.Values[1].Kind != tuple.KindString {
		t.Values = append(t.Values[:0], tuple.Int(n), tuple.Str(""))
	}
	// Only what changes is written: the number and the payload's string.
	t.Values[0].I = n
	t.Values[1].S = g.pool[off : off+g.size]
	return true
}

// splitmix is the splitmix64 finaliser: consecutive inputs give
// unrelated outputs.
func splitmix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
