package operator

import "github.com/fedstream/fedstream/worker/tuple"

// Collector is an Emitter that keeps a deep copy of every tuple it is
// given, in order. It is meant for tests and tools; it is not safe for
// concurrent use.
type Collector struct {
	Tuples []tuple.Tuple
}

// Collect returns an empty Collector.
func Collect() *Collector { return &Collector{} }

// Emit appends a deep copy of t (values and their strings are copied).
func (c *Collector) Emit(t *tuple.Tuple) {
	cp := *t
	cp.Values = make([]tuple.Value, len(t.Values))
	for i, v := range t.Values {
		cp.Values[i] = cloneValue(v)
	}
	c.Tuples = append(c.Tuples, cp)
}

// Reset forgets the collected tuples.
func (c *Collector) Reset() { c.Tuples = nil }
