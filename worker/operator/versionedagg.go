package operator

import (
	"errors"
	"fmt"
	"slices"

	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrNotMigratable means a new version of a stateful operator cannot share
// or migrate the state of the running one (another window, other groups,
// another input): live reconfiguration refuses it.
var ErrNotMigratable = errors.New("state cannot be migrated to the new version")

// VersionedAggregate runs the versions of one windowed aggregate side by
// side over one shared state (live reconfiguration of a stateful
// operator; Versioned is the stateless counterpart).
//
// The state interface: every version has the same input, window and
// group_by, so they share the windows and their groups. Each group holds
// one accumulator per distinct function (fn(field)) of the versions
// loaded, its columns; a version is a view naming, in its output order,
// the columns it reads. A tuple is processed by the version of its tag's
// configuration, which updates that version's columns only.
//
// Migration (a version adding a function): the column is appended to
// every open group in place, empty, when the version is loaded (between
// two releases: nothing stops). Rules, deterministic from the stream:
//
//   - A function two versions share is one accumulator updated by the
//     tuples of both: exact over the whole window, whichever versions
//     processed its tuples (renaming, reordering or dropping functions
//     keeps every total exact).
//   - A window's rows are produced by one version: that of the newest
//     configuration among its tuples' tags, or of the oldest
//     configuration still in use (the floor) if that is newer, since
//     older versions are gone. The rows carry that configuration's tag,
//     so the operators after the aggregate use the same configuration.
//   - A function a version adds covers the tuples processed by versions
//     that have it. In a window open at the switch it therefore misses
//     the window's tuples of older configurations; over no tuple at all
//     it reports 0 (count, count_distinct, sum, avg) or the zero value of
//     the field's kind (min, max). Windows opened after the last older
//     tuple (once the floor passed the switch) are exact.
//
// Columns are never removed while the operator runs (a dropped function's
// accumulator is no longer updated), so every copy that loads the same
// versions has the same columns in the same order and the same snapshot
// format. Like every operator it is driven by one goroutine; AddEpoch and
// SetFloor must be called on it (or while it does not process).
type VersionedAggregate struct {
	name    string
	st      *aggregate // the shared state; st.specs are the columns
	views   map[int]*aggView
	byEpoch []int
	floor   uint64
	em      taggedEmitter
	// base is the signature and column count of the aggregate wrapped
	// (version 1, before any migration): Restore also takes a snapshot of
	// it unversioned, taken before its task loaded a plan changing it.
	baseSig  string
	baseCols int
}

// aggView is one version of the aggregate over the shared columns.
type aggView struct {
	cols    []int
	intSums []int // the columns of cols adding up an int field
	outSch  *tuple.Schema
}

// NewVersionedAggregate wraps op (an aggregate built by New, holding the
// state) as version `version` of the configurations 0..epoch.
func NewVersionedAggregate(name string, op Operator, version int, epoch uint64) (*VersionedAggregate, error) {
	a, ok := op.(*aggregate)
	if !ok {
		return nil, fmt.Errorf("operator %q: %w: %T is not an aggregate", name, ErrNotMigratable, op)
	}
	v := &VersionedAggregate{name: name, st: a, views: map[int]*aggView{}, baseSig: a.signature, baseCols: len(a.specs)}
	cols := make([]int, len(a.specs))
	for i := range cols {
		cols[i] = i
	}
	v.views[version] = &aggView{cols: cols, intSums: slices.Clone(a.intSums), outSch: a.outSch}
	for range epoch + 1 {
		v.byEpoch = append(v.byEpoch, version)
	}
	return v, nil
}

// Name is the operator's name.
func (v *VersionedAggregate) Name() string { return v.name }

// Latest is the newest epoch the operator knows.
func (v *VersionedAggregate) Latest() uint64 { return uint64(len(v.byEpoch) - 1) }

// AddEpoch records the operator's version in the next configuration;
// build makes its definition's aggregate if that version is not loaded
// yet. A version with another input, window or group_by is refused
// (ErrNotMigratable) and nothing changes; one adding functions migrates
// the state in place (see the type's rules).
func (v *VersionedAggregate) AddEpoch(version int, build func() (Operator, error)) error {
	if _, ok := v.views[version]; !ok {
		op, err := build()
		if err != nil {
			return fmt.Errorf("operator %q version %d: %w", v.name, version, err)
		}
		view, err := v.migrate(op)
		if err != nil {
			return fmt.Errorf("operator %q version %d: %w", v.name, version, err)
		}
		v.views[version] = view
	}
	v.byEpoch = append(v.byEpoch, version)
	return nil
}

// migrate maps the functions of a new version's aggregate to columns of
// the shared state, appending (empty, to every open group) those it does
// not hold yet.
func (v *VersionedAggregate) migrate(op Operator) (*aggView, error) {
	st := v.st
	b, ok := op.(*aggregate)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %T is not an aggregate", ErrNotMigratable, op)
	case schemaSignature(b.in) != schemaSignature(st.in):
		return nil, fmt.Errorf("%w: input %s, the running version's %s", ErrNotMigratable, schemaSignature(b.in), schemaSignature(st.in))
	case b.size != st.size || b.slide != st.slide:
		return nil, fmt.Errorf("%w: another window (open windows would not match)", ErrNotMigratable)
	case !slices.Equal(b.groupBy, st.groupBy):
		return nil, fmt.Errorf("%w: another group_by (open groups would not match)", ErrNotMigratable)
	}
	view := &aggView{outSch: b.outSch}
	var added []aggSpec
	for i, s := range b.specs {
		c := slices.IndexFunc(st.specs, func(x aggSpec) bool { return x.src == s.src })
		if c < 0 {
			c = len(st.specs) + len(added)
			added = append(added, s)
		}
		view.cols = append(view.cols, c)
		if slices.Contains(b.intSums, i) {
			view.intSums = append(view.intSums, c)
		}
	}
	if len(added) == 0 {
		return view, nil
	}
	st.specs = append(st.specs, added...)
	for _, s := range added {
		if s.field >= 0 && !slices.Contains(st.checked, s.field) {
			st.checked = append(st.checked, s.field)
		}
	}
	slices.Sort(st.checked)
	for _, w := range st.windows {
		for _, g := range w.groups {
			g.accs = append(g.accs[:len(g.accs):len(g.accs)], make([]accumulator, len(added))...)
		}
	}
	// The snapshot's signature names every column: a copy restores only
	// into an operator that loaded the same versions.
	sig := st.signature
	for _, s := range added {
		sig += fmt.Sprintf(" %s=%s", s.name, s.src)
	}
	st.signature = sig
	return view, nil
}

// SetFloor says no tuple of an epoch below floor can arrive any more: the
// versions only older epochs used are removed (their columns stay, no
// longer updated).
func (v *VersionedAggregate) SetFloor(floor uint64) {
	if floor <= v.floor {
		return
	}
	v.floor = min(floor, v.Latest())
	keep := v.byEpoch[v.floor:]
	for ver := range v.views {
		if !slices.Contains(keep, ver) {
			delete(v.views, ver)
		}
	}
}

// Versions lists the loaded versions, ascending.
func (v *VersionedAggregate) Versions() []int {
	out := make([]int, 0, len(v.views))
	for ver := range v.views {
		out = append(out, ver)
	}
	slices.Sort(out)
	return out
}

func (v *VersionedAggregate) epoch(tag uint64) uint64 {
	return min(max(tag, v.floor), v.Latest())
}

// Process updates the columns of the version of the tuple's configuration
// and records the configuration in the windows the tuple went to.
func (v *VersionedAggregate) Process(port int, t *tuple.Tuple, out Emitter) error {
	st := v.st
	e := v.epoch(t.Version)
	view := v.views[v.byEpoch[e]]
	st.cols, st.intSums = view.cols, view.intSums
	late := st.late
	if err := st.Process(port, t, out); err != nil || st.late != late {
		return err
	}
	for k := st.kFrom; k <= st.kTo; k++ {
		if w := st.windows[k*st.slide]; w != nil && w.epoch < e {
			w.epoch = e
		}
	}
	return nil
}

// Advance emits every closed window through the version of its epoch (at
// least the floor), tagged with that epoch.
func (v *VersionedAggregate) Advance(watermark int64, out Emitter) error {
	st := v.st
	v.em.out = out
	st.advance(watermark, func(w *aggWindow) {
		e := v.epoch(w.epoch)
		v.em.tag = e
		v.emitWindow(w, v.views[v.byEpoch[e]], &v.em)
	})
	return nil
}

func (v *VersionedAggregate) emitWindow(w *aggWindow, view *aggView, out Emitter) {
	st := v.st
	keys := make([]string, 0, len(w.groups))
	for k := range w.groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	end := w.start + st.size
	for _, k := range keys {
		g := w.groups[k]
		vals := append(st.out.Values[:0], g.keyVals...)
		for _, c := range view.cols {
			s, acc := &st.specs[c], &g.accs[c]
			if acc.count == 0 {
				vals = append(vals, emptyResult(s))
				continue
			}
			vals = append(vals, st.result(s, acc))
		}
		vals = append(vals, tuple.Timestamp(end))
		st.out = tuple.Tuple{Type: tuple.Stable, STime: end, Values: vals}
		if g.tentative {
			st.out.Type = tuple.Tentative
		}
		out.Emit(&st.out)
	}
}

// emptyResult is a function over no tuple (a column added while a window
// was open, none of whose tuples in a group its versions processed).
func emptyResult(s *aggSpec) tuple.Value {
	if s.fn == aggAvg {
		return tuple.Float(0)
	}
	return tuple.Value{Kind: s.out}
}

// Snapshot encodes each open window's epoch, then the shared state (every
// column).
func (v *VersionedAggregate) Snapshot() ([]byte, error) {
	st := v.st
	e := newEncoder("versioned " + st.signature)
	starts := make([]int64, 0, len(st.windows))
	for s := range st.windows {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	e.uvarint(uint64(len(starts)))
	for _, s := range starts {
		e.varint(s)
		e.uvarint(st.windows[s].epoch)
	}
	inner, err := st.Snapshot()
	if err != nil {
		return nil, err
	}
	e.str(string(inner))
	return e.b, nil
}

// Restore replaces the state with a snapshot of an operator that loaded
// the same versions.
func (v *VersionedAggregate) Restore(state []byte) error {
	st := v.st
	d, err := newDecoder(state, "versioned "+st.signature)
	if err != nil {
		if plain, perr := newDecoder(state, v.baseSig); perr == nil && plain.err == nil {
			return v.restoreUnversioned(state)
		}
		return err
	}
	epochs := map[int64]uint64{}
	for range d.count(2) {
		s := d.varint()
		epochs[s] = d.uvarint()
	}
	inner := d.str()
	if err := d.finish(); err != nil {
		return err
	}
	if err := st.Restore([]byte(inner)); err != nil {
		return err
	}
	for s, w := range st.windows {
		w.epoch = epochs[s]
	}
	return nil
}

// restoreUnversioned restores a snapshot of the aggregate as it ran
// before any plan changed it (every window of epoch 0): into its
// original columns, the columns added since appended empty, as a
// migration at load would have.
func (v *VersionedAggregate) restoreUnversioned(state []byte) error {
	st := v.st
	specs, sig := st.specs, st.signature
	st.specs, st.signature = specs[:v.baseCols], v.baseSig
	err := st.Restore(state)
	st.specs, st.signature = specs, sig
	if err != nil {
		return err
	}
	if added := len(specs) - v.baseCols; added > 0 {
		for _, w := range st.windows {
			for _, g := range w.groups {
				g.accs = append(g.accs[:len(g.accs):len(g.accs)], make([]accumulator, added)...)
			}
		}
	}
	return nil
}

// LateTuples counts tuples dropped for arriving below the watermark.
func (v *VersionedAggregate) LateTuples() uint64 { return v.st.late }

// OutputSchema is the newest version's.
func (v *VersionedAggregate) OutputSchema() *tuple.Schema {
	return v.views[v.byEpoch[len(v.byEpoch)-1]].outSch
}
