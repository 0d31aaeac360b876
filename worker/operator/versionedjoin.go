package operator

import (
	"fmt"
	"maps"
	"slices"

	"github.com/fedstream/fedstream/worker/tuple"
)

// VersionedJoin runs the versions of one join side by side over one
// shared state (live reconfiguration). A join's state shape is its
// window and keys (on), which every version keeps: the buffered tuples of
// both sides are shared, whatever version's configuration they belong
// to. What a version may change is its predicate over matched pairs
// (`where`). Rules, deterministic from the stream:
//
//   - Every tuple is buffered once, with its configuration (its tag).
//   - A pair is produced by the version of the newer of its two tuples'
//     configurations (at least the floor, older versions being gone) and
//     carries that configuration's tag: an old tuple meeting a new one
//     is judged by the new version, so the operators after the join run
//     the same configuration as the newer tuple's path.
//   - Nothing moves at the switch: windows open across it keep every
//     tuple, and a same-semantics upgrade emits exactly the pairs one
//     version would have.
//
// Like every operator it is driven by one goroutine; AddEpoch and
// SetFloor must be called on it (or while it does not process).
type VersionedJoin struct {
	name    string
	j       *join
	preds   map[int]*joinPredicate // by version; nil: every pair
	byEpoch []int
	floor   uint64
}

// NewVersionedJoin wraps op (a join built by New, holding the state) as
// version `version` of the configurations 0..epoch.
func NewVersionedJoin(name string, op Operator, version int, epoch uint64) (*VersionedJoin, error) {
	j, ok := op.(*join)
	if !ok {
		return nil, fmt.Errorf("operator %q: %w: %T is not a join", name, ErrNotMigratable, op)
	}
	v := &VersionedJoin{name: name, j: j, preds: map[int]*joinPredicate{version: j.where}}
	for range epoch + 1 {
		v.byEpoch = append(v.byEpoch, version)
	}
	j.versions = func(e uint64) *joinPredicate { return v.preds[v.byEpoch[v.epoch(e)]] }
	return v, nil
}

// Name is the operator's name.
func (v *VersionedJoin) Name() string { return v.name }

// Latest is the newest epoch the operator knows.
func (v *VersionedJoin) Latest() uint64 { return uint64(len(v.byEpoch) - 1) }

// AddEpoch records the operator's version in the next configuration; a
// version with other inputs, keys or window is refused (ErrNotMigratable:
// its buffers would not match) and nothing changes.
func (v *VersionedJoin) AddEpoch(version int, build func() (Operator, error)) error {
	if _, ok := v.preds[version]; !ok {
		op, err := build()
		if err != nil {
			return fmt.Errorf("operator %q version %d: %w", v.name, version, err)
		}
		b, ok := op.(*join)
		switch {
		case !ok:
			return fmt.Errorf("operator %q version %d: %w: %T is not a join", v.name, version, ErrNotMigratable, op)
		case b.signature != v.j.signature:
			return fmt.Errorf("operator %q version %d: %w: %s, the running version's %s (other inputs, keys or window)", v.name, version, ErrNotMigratable, b.signature, v.j.signature)
		}
		v.preds[version] = b.where
	}
	v.byEpoch = append(v.byEpoch, version)
	return nil
}

// SetFloor says no tuple of an epoch below floor can arrive any more: the
// versions only older epochs used are removed. Buffered tuples of older
// epochs stay (a pair with one of them is produced by the newer one's
// version).
func (v *VersionedJoin) SetFloor(floor uint64) {
	if floor <= v.floor {
		return
	}
	v.floor = min(floor, v.Latest())
	keep := v.byEpoch[v.floor:]
	for ver := range v.preds {
		if !slices.Contains(keep, ver) {
			delete(v.preds, ver)
		}
	}
}

// Versions lists the loaded versions, ascending.
func (v *VersionedJoin) Versions() []int {
	return slices.Sorted(maps.Keys(v.preds))
}

func (v *VersionedJoin) epoch(tag uint64) uint64 {
	return min(max(tag, v.floor), v.Latest())
}

// Process buffers the tuple with its configuration and emits its pairs.
func (v *VersionedJoin) Process(port int, t *tuple.Tuple, out Emitter) error {
	v.j.epochOf = v.epoch(t.Version)
	return v.j.Process(port, t, out)
}

func (v *VersionedJoin) Advance(watermark int64, out Emitter) error {
	return v.j.Advance(watermark, out)
}

// LateTuples counts tuples dropped for arriving below the watermark.
func (v *VersionedJoin) LateTuples() uint64 { return v.j.late }

func (v *VersionedJoin) OutputSchema() *tuple.Schema { return v.j.outSch }

// Snapshot is the join's state followed by every buffered tuple's
// configuration, in the order the join encodes them.
func (v *VersionedJoin) Snapshot() ([]byte, error) {
	inner, err := v.j.Snapshot()
	if err != nil {
		return nil, err
	}
	e := newEncoder("versioned " + v.j.signature)
	e.str(string(inner))
	v.eachStored(func(st *storedTuple) { e.uvarint(st.epoch) })
	return e.b, nil
}

// Restore takes a snapshot of a versioned copy, or of the join as it ran
// before any plan changed it (every tuple of configuration 0).
func (v *VersionedJoin) Restore(state []byte) error {
	d, err := newDecoder(state, "versioned "+v.j.signature)
	if err != nil {
		return v.j.Restore(state)
	}
	inner := d.str()
	if d.err != nil {
		return d.err
	}
	if err := v.j.Restore([]byte(inner)); err != nil {
		return err
	}
	v.eachStored(func(st *storedTuple) { st.epoch = d.uvarint() })
	return d.finish()
}

// eachStored visits every buffered tuple in the join's snapshot order:
// windows by index, groups by key, left side then right, arrival order.
func (v *VersionedJoin) eachStored(f func(*storedTuple)) {
	for _, i := range slices.Sorted(maps.Keys(v.j.windows)) {
		w := v.j.windows[i]
		for _, k := range slices.Sorted(maps.Keys(w.groups)) {
			g := w.groups[k]
			for side := range g.sides {
				for n := range g.sides[side] {
					f(&g.sides[side][n])
				}
			}
		}
	}
}
