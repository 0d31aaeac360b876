package operator

import (
	"fmt"
	"slices"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Versioned runs the versions of one stateless operator side by side
// (live reconfiguration). A tuple's version tag (tuple.Tuple.Version) is
// the epoch of the configuration it belongs to: the select step maps it to
// the version the operator has in that epoch, that version processes the
// tuple, and what it emits keeps the tag, so every operator on the tuple's
// path uses the versions of one configuration. A tag below the floor (0
// from a task that stopped tracking, see dynamic tracking in the runtime)
// means the floor: the oldest epoch whose tuples may still arrive.
//
// Only stateless operators (filter, map, split, union) are versioned:
// their instances hold no state, so adding and removing versions never
// moves data. Like every operator it is driven by one goroutine; AddEpoch
// and SetFloor must be called on it (or while it does not process).
type Versioned struct {
	name string
	// byEpoch[e] is the version of configuration e; insts the instance of
	// each version still loaded.
	byEpoch []int
	insts   map[int]Operator
	floor   uint64
	em      taggedEmitter
}

// taggedEmitter gives what it forwards the tag of the tuple in process.
type taggedEmitter struct {
	out Emitter
	tag uint64
}

func (e *taggedEmitter) Emit(t *tuple.Tuple) {
	t.Version = e.tag
	e.out.Emit(t)
}

// NewVersioned wraps op as version `version` of the configurations
// 0..epoch (what a task runs when it starts).
func NewVersioned(name string, op Operator, version int, epoch uint64) *Versioned {
	v := &Versioned{name: name, insts: map[int]Operator{version: op}}
	for range epoch + 1 {
		v.byEpoch = append(v.byEpoch, version)
	}
	return v
}

// Name is the operator's name.
func (v *Versioned) Name() string { return v.name }

// Latest is the newest epoch the operator knows.
func (v *Versioned) Latest() uint64 { return uint64(len(v.byEpoch) - 1) }

// AddEpoch records the operator's version in the next configuration
// (epoch Latest()+1); build makes the instance if that version is not
// loaded yet. Nothing processing now is disturbed.
func (v *Versioned) AddEpoch(version int, build func() (Operator, error)) error {
	if _, ok := v.insts[version]; !ok {
		op, err := build()
		if err != nil {
			return fmt.Errorf("operator %q version %d: %w", v.name, version, err)
		}
		v.insts[version] = op
	}
	v.byEpoch = append(v.byEpoch, version)
	return nil
}

// SetFloor says no tuple of an epoch below floor can arrive any more (the
// task has the markers of epoch floor from every upstream instance): the
// versions only older epochs used are removed.
func (v *Versioned) SetFloor(floor uint64) {
	if floor <= v.floor {
		return
	}
	v.floor = min(floor, v.Latest())
	keep := v.byEpoch[v.floor:]
	for ver := range v.insts {
		if !slices.Contains(keep, ver) {
			delete(v.insts, ver)
		}
	}
}

// Versions lists the loaded versions, ascending.
func (v *Versioned) Versions() []int {
	out := make([]int, 0, len(v.insts))
	for ver := range v.insts {
		out = append(out, ver)
	}
	slices.Sort(out)
	return out
}

// epoch is the configuration a tuple tagged tag belongs to here.
func (v *Versioned) epoch(tag uint64) uint64 {
	return min(max(tag, v.floor), v.Latest())
}

// Select returns the version that processes a tuple tagged tag.
func (v *Versioned) Select(tag uint64) int { return v.byEpoch[v.epoch(tag)] }

func (v *Versioned) Process(port int, t *tuple.Tuple, out Emitter) error {
	e := v.epoch(t.Version)
	v.em.out, v.em.tag = out, e
	return v.insts[v.byEpoch[e]].Process(port, t, &v.em)
}

// Advance reaches every loaded version (stateless: they emit nothing on
// it, but keep their promise checks).
func (v *Versioned) Advance(watermark int64, out Emitter) error {
	for _, ver := range v.Versions() {
		if err := v.insts[ver].Advance(watermark, out); err != nil {
			return err
		}
	}
	return nil
}

// Snapshot is the newest version's (stateless operators have no state to
// share; the format is the unversioned operator's).
func (v *Versioned) Snapshot() ([]byte, error) { return v.newest().Snapshot() }

// Restore takes a snapshot of any loaded version: a stateless operator's
// snapshot only names it, and a copy may load versions its original did
// not (or no longer) run, whose signatures differ (another input schema
// behind a changed aggregate). Refused only if no version accepts it.
func (v *Versioned) Restore(state []byte) error {
	var first error
	for _, ver := range v.Versions() {
		err := v.insts[ver].Restore(state)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

func (v *Versioned) OutputSchema() *tuple.Schema { return v.newest().OutputSchema() }

func (v *Versioned) newest() Operator { return v.insts[v.byEpoch[len(v.byEpoch)-1]] }

// ChainMembers returns the operators chained in op (op itself when it is
// not a chain), so a task can version them one by one.
func ChainMembers(op Operator) []Operator {
	if c, ok := op.(*chain); ok {
		return slices.Clone(c.ops)
	}
	if op == nil {
		return nil
	}
	return []Operator{op}
}

// Stateless reports whether an operator of this type holds no state
// between tuples, so that its versions can run side by side.
func Stateless(typ string) bool {
	switch typ {
	case "filter", "map", "split", "union":
		return true
	}
	return false
}
