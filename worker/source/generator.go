// Package source produces the input streams of a query: deterministic
// built-in generators (netmon, words, vitals, blob) for tests, demos and
// benchmarks, and the JSON-lines parser behind the ingest API.
//
// Generators are pure functions of (definition, partition): record n always
// has the same values and stime = start + n*1e9/rate, independent of the wall
// clock, so replicas of a source partition produce identical streams.
package source

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrUnknownGenerator is returned for a generator kind this package does not
// implement.
var ErrUnknownGenerator = errors.New("unknown generator kind")

// LogicalRate is the stime rate (records per second) used when a generator's
// rate is 0 ("as fast as possible"): stimes advance 1µs per record.
const LogicalRate = 1_000_000

// Generator produces one partition of a built-in source.
type Generator interface {
	// Schema is the schema of the generated tuples.
	Schema() *tuple.Schema
	// Next fills t.Values (reusing its capacity) and t.STime with the next
	// record. It returns false, leaving t untouched, once Limit records have
	// been produced.
	Next(t *tuple.Tuple) bool
}

// GeneratorSchema is the fixed schema of a generator kind.
func GeneratorSchema(kind string) ([]queryspec.Field, error) {
	s, err := queryspec.GeneratorSchema(kind)
	if err != nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownGenerator, kind)
	}
	return s, nil
}

// NewGenerator builds the generator for one partition of a source. The
// partition number is mixed into the seed, so partitions differ from one
// another but each is reproducible.
func NewGenerator(g *queryspec.Generator, partition int) (Generator, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: nil generator definition", ErrUnknownGenerator)
	}
	if g.Rate < 0 || g.Limit < 0 || partition < 0 {
		return nil, fmt.Errorf("generator %s: rate %d, limit %d and partition %d must not be negative", g.Kind, g.Rate, g.Limit, partition)
	}
	fields, err := GeneratorSchema(g.Kind)
	if err != nil {
		return nil, err
	}
	c, err := newClock(g)
	if err != nil {
		return nil, err
	}
	schema := toTupleSchema(fields)
	rng := rand.New(rand.NewPCG(uint64(g.Seed), partitionStream(g.Kind, partition)))
	switch g.Kind {
	case queryspec.GenNetmon:
		return newNetmon(c, schema, rng, g.Monitors), nil
	case queryspec.GenWords:
		return newWords(c, schema, rng), nil
	case queryspec.GenVitals:
		return newVitals(c, schema, rng), nil
	case queryspec.GenBlob:
		if g.Size < 0 || g.Size > queryspec.MaxBlobSize {
			return nil, fmt.Errorf("generator %s: size %d is out of range (want 1..%d, or 0 for the default %d)",
				g.Kind, g.Size, queryspec.MaxBlobSize, queryspec.DefaultBlobSize)
		}
		return newBlob(c, schema, rng, g.Size), nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownGenerator, g.Kind)
}

// partitionStream is the PCG stream selector: distinct per kind and
// partition, fixed forever (changing it changes every generated stream).
func partitionStream(kind string, partition int) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(kind); i++ {
		h = (h ^ uint64(kind[i])) * 1099511628211
	}
	return h ^ (uint64(partition)+1)*0x9E3779B97F4A7C15
}

func toTupleSchema(fields []queryspec.Field) *tuple.Schema {
	out := make([]tuple.Field, len(fields))
	for i, f := range fields {
		k, _ := tuple.ParseKind(f.Type)
		out[i] = tuple.Field{Name: f.Name, Kind: k}
	}
	return tuple.NewSchema(out)
}

// clock numbers records and derives their stime from the rate: record n
// has stime start + (n/rate)*1e9 + (n%rate)*1e9/rate.
type clock struct {
	start int64 // stime of record 0, ns
	rate  int64 // records per second, > 0
	limit int64 // 0 = unbounded
	n     int64 // number of the next record

	// The stime of record at, kept up to date by additions instead of
	// three divisions per record: at = sec*rate + rem, and rem*1e9 =
	// q*rate + r (0 <= r < rate). stepQ and stepR are 1e9/rate and
	// 1e9%rate. Valid when at == n and the steps are set (see seek).
	at, sec, rem, q, r int64
	stepQ, stepR       int64
}

// seek computes the incremental state for record n.
func (c *clock) seek(n int64) {
	c.at, c.sec, c.rem = n, n/c.rate, n%c.rate
	c.q, c.r = c.rem*1e9/c.rate, c.rem*1e9%c.rate
	c.stepQ, c.stepR = 1e9/c.rate, 1e9%c.rate
}

func newClock(g *queryspec.Generator) (clock, error) {
	c := clock{rate: int64(g.Rate), limit: g.Limit}
	if c.rate == 0 {
		c.rate = LogicalRate
	}
	if g.Start != "" {
		t, err := time.Parse(time.RFC3339Nano, g.Start)
		if err != nil {
			return c, fmt.Errorf("generator %s: start %q is not an RFC 3339 time: %w", g.Kind, g.Start, err)
		}
		c.start = t.UnixNano()
	}
	return c, nil
}

// tick returns the next record's number and stime, or ok=false at the limit.
// The split into whole seconds and remainder keeps n*1e9 from overflowing.
func (c *clock) tick() (n, stime int64, ok bool) {
	if c.limit > 0 && c.n >= c.limit {
		return 0, 0, false
	}
	n = c.n
	if c.at != n || c.stepQ == 0 && c.stepR == 0 {
		c.seek(n) // first record, or n was set directly
	}
	stime = c.start + c.sec*1e9 + c.q
	c.n++
	c.at++
	c.rem++
	c.q += c.stepQ
	if c.r += c.stepR; c.r >= c.rate {
		c.r -= c.rate
		c.q++
	}
	if c.rem == c.rate {
		c.sec++
		c.rem, c.q, c.r = 0, 0, 0
	}
	return n, stime, true
}
