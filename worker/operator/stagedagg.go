package operator

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fedstream/fedstream/slots"
	"github.com/fedstream/fedstream/worker/tuple"
)

// StagedAggregate runs the versions of one aggregate whose state shape
// changed (another window or group_by: live reconfiguration, issue 13
// item 5; query validation lets only the window change, the group_by
// routing the input). Versions with the same window and group_by share one state as
// a VersionedAggregate; a version with another shape starts a new
// **stage**: a state of its own, empty when the version is loaded, which
// only tuples of its configurations update. Rules, all decided by the
// stream (replicas decide alike):
//
//   - A tuple is processed by the stage of its tag's configuration (the
//     version of its configuration, as everywhere): an old-epoch tuple
//     updates the old windows, a new-epoch tuple the new ones. Nothing is
//     moved between stages, so nothing stops.
//   - Every stage advances with the watermark: the old stage's windows
//     that were open at the switch finish under the old version (with its
//     tuples), the new stage's windows open from the first new-epoch
//     tuple on. Each stage's rows carry its epochs' tags.
//   - Where the switch falls on a window boundary of both shapes, every
//     window is exact: the workers align a plan's cut to the windows of
//     the aggregates it reshapes (AlignCut). Otherwise a window of either
//     stage that straddles the cut holds only the tuples of its own side.
//   - Every stage holds the same keys' groups by hash slot: a rescale
//     hands over each stage's groups of the moved slots (stagedSlots).
//   - A stage all of whose configurations are older than the floor gets
//     no tuple any more; once its last window was emitted it is inactive
//     (its versions are no longer listed). It stays, empty, so that every
//     copy that loaded the same versions has the same stages (snapshots
//     and slot hand-overs match stage for stage).
//
// Like every operator it is driven by one goroutine; AddEpoch and
// SetFloor must be called on it (or while it does not process).
type StagedAggregate struct {
	name    string
	stages  []*aggStage
	byEpoch []int // stage index by epoch
	floor   uint64
}

// aggStage is one state shape: a VersionedAggregate serving the
// configurations from..(the next stage's from - 1).
type aggStage struct {
	va   *VersionedAggregate
	from uint64
}

// NewStagedAggregate wraps va (the aggregate's versions so far, epochs
// 0..va.Latest()) as the first stage.
func NewStagedAggregate(va *VersionedAggregate) *StagedAggregate {
	s := &StagedAggregate{name: va.name, stages: []*aggStage{{va: va}}}
	for range va.Latest() + 1 {
		s.byEpoch = append(s.byEpoch, 0)
	}
	return s
}

// Name is the operator's name.
func (s *StagedAggregate) Name() string { return s.name }

// Latest is the newest epoch the operator knows.
func (s *StagedAggregate) Latest() uint64 { return uint64(len(s.byEpoch) - 1) }

// Reshapes reports whether a version of the aggregate built by op has
// another window or group_by than cur (the aggregate a stage runs): it
// then needs a stage of its own. Another input is never migratable.
func Reshapes(cur *VersionedAggregate, op Operator) (bool, error) {
	b, ok := op.(*aggregate)
	if !ok {
		return false, fmt.Errorf("%w: %T is not an aggregate", ErrNotMigratable, op)
	}
	st := cur.st
	if schemaSignature(b.in) != schemaSignature(st.in) {
		return false, fmt.Errorf("%w: input %s, the running version's %s", ErrNotMigratable, schemaSignature(b.in), schemaSignature(st.in))
	}
	return b.size != st.size || b.slide != st.slide || !slices.Equal(b.groupBy, st.groupBy), nil
}

// AddEpoch records the operator's version in the next configuration. A
// version with the last stage's window and group_by joins that stage
// (sharing its state, see VersionedAggregate); one with another shape
// starts a new stage.
func (s *StagedAggregate) AddEpoch(version int, build func() (Operator, error)) error {
	last := s.stages[len(s.stages)-1]
	e := s.Latest() + 1
	if _, loaded := last.va.views[version]; !loaded {
		op, err := build()
		if err != nil {
			return fmt.Errorf("operator %q version %d: %w", s.name, version, err)
		}
		reshape, err := Reshapes(last.va, op)
		if err != nil {
			return fmt.Errorf("operator %q version %d: %w", s.name, version, err)
		}
		if reshape {
			va, err := NewVersionedAggregate(s.name, op, version, e)
			if err != nil {
				return err
			}
			s.stages = append(s.stages, &aggStage{va: va, from: e})
			s.byEpoch = append(s.byEpoch, len(s.stages)-1)
			return nil
		}
		if err := last.va.AddEpoch(version, func() (Operator, error) { return op, nil }); err != nil {
			return err
		}
		s.byEpoch = append(s.byEpoch, len(s.stages)-1)
		return nil
	}
	if err := last.va.AddEpoch(version, build); err != nil {
		return err
	}
	s.byEpoch = append(s.byEpoch, len(s.stages)-1)
	return nil
}

// SetFloor says no tuple of an epoch below floor can arrive any more:
// each stage drops the versions only older epochs used.
func (s *StagedAggregate) SetFloor(floor uint64) {
	if floor <= s.floor {
		return
	}
	s.floor = min(floor, s.Latest())
	for _, st := range s.stages {
		st.va.SetFloor(min(s.floor, st.va.Latest()))
	}
}

// active reports whether stage i may still emit: a configuration of it is
// at or above the floor, or it holds open windows.
func (s *StagedAggregate) active(i int) bool {
	return i == len(s.stages)-1 || s.stages[i+1].from > s.floor || len(s.stages[i].va.st.windows) > 0
}

// Versions lists the loaded versions of the active stages, ascending.
func (s *StagedAggregate) Versions() []int {
	var out []int
	for i, st := range s.stages {
		if !s.active(i) {
			continue
		}
		for _, v := range st.va.Versions() {
			if !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Stages is the number of active state shapes.
func (s *StagedAggregate) Stages() int {
	n := 0
	for i := range s.stages {
		if s.active(i) {
			n++
		}
	}
	return n
}

// Process hands the tuple to the stage of its configuration.
func (s *StagedAggregate) Process(port int, t *tuple.Tuple, out Emitter) error {
	e := min(max(t.Version, s.floor), s.Latest())
	tp := *t
	tp.Version = e
	return s.stages[s.byEpoch[e]].va.Process(port, &tp, out)
}

// Advance advances every stage, the oldest first: the old shape's windows
// finish under the old version while the new shape's fill.
func (s *StagedAggregate) Advance(watermark int64, out Emitter) error {
	for _, st := range s.stages {
		if err := st.va.Advance(watermark, out); err != nil {
			return err
		}
	}
	return nil
}

// LateTuples counts the tuples every stage dropped as late.
func (s *StagedAggregate) LateTuples() uint64 {
	var n uint64
	for _, st := range s.stages {
		n += st.va.LateTuples()
	}
	return n
}

// OutputSchema is the newest version's.
func (s *StagedAggregate) OutputSchema() *tuple.Schema {
	return s.stages[len(s.stages)-1].va.OutputSchema()
}

const stagedMagic = "staged aggregate"

// Snapshot encodes the floor and each stage (its first epoch and its
// VersionedAggregate snapshot).
func (s *StagedAggregate) Snapshot() ([]byte, error) {
	e := newEncoder(stagedMagic)
	e.uvarint(s.floor)
	e.uvarint(uint64(len(s.stages)))
	for _, st := range s.stages {
		b, err := st.va.Snapshot()
		if err != nil {
			return nil, err
		}
		e.uvarint(st.from)
		e.str(string(b))
	}
	return e.b, nil
}

// ErrStagesDiffer means a staged aggregate's snapshot holds other stages
// than the restoring copy loaded (it loaded other versions).
var ErrStagesDiffer = errors.New("the snapshot's state shapes are not the ones loaded")

// Restore takes a snapshot of an operator that loaded the same versions
// (the same stages), or one taken before the version reshaping it was
// loaded (the first stage's state; the later stages start empty, as at
// load).
func (s *StagedAggregate) Restore(state []byte) error {
	d, err := newDecoder(state, stagedMagic)
	if err != nil {
		return s.stages[0].va.Restore(state)
	}
	floor := d.uvarint()
	n := d.count(2)
	if d.err == nil && n != len(s.stages) {
		return fmt.Errorf("%w: operator %q: %d stages, %d loaded", ErrStagesDiffer, s.name, n, len(s.stages))
	}
	for _, st := range s.stages {
		from, b := d.uvarint(), d.str()
		if d.err != nil {
			return d.err
		}
		if from != st.from {
			return fmt.Errorf("%w: operator %q: a stage from epoch %d, loaded %d", ErrStagesDiffer, s.name, from, st.from)
		}
		if err := st.va.Restore([]byte(b)); err != nil {
			return err
		}
	}
	if err := d.finish(); err != nil {
		return err
	}
	if floor > s.floor {
		s.SetFloor(floor)
	}
	return nil
}

// stagedSlots is the slot state of a StagedAggregate of several stages:
// every stage's groups of the slots, stage for stage (every copy that
// loaded the same versions has the same stages).
type stagedSlots struct{ s *StagedAggregate }

func (x stagedSlots) HeldSlots() slots.Set {
	var out slots.Set
	for _, st := range x.s.stages {
		out = out.Union(st.va.st.HeldSlots())
	}
	return out
}

func (x stagedSlots) SnapshotSlots(set slots.Set) ([]byte, error) {
	e := newEncoder(stagedMagic + " slots")
	e.uvarint(uint64(len(x.s.stages)))
	for _, st := range x.s.stages {
		b, err := st.va.st.SnapshotSlots(set)
		if err != nil {
			return nil, err
		}
		e.uvarint(st.from)
		e.str(string(b))
	}
	return e.b, nil
}

// RestoreSlots installs every stage's part; on error nothing changes
// (each part is checked by a trial decode first: the stages' own
// RestoreSlots change nothing on error, and all are restored only once
// the layout matches).
func (x stagedSlots) RestoreSlots(data []byte) error {
	d, err := newDecoder(data, stagedMagic+" slots")
	if err != nil {
		return err
	}
	n := d.count(2)
	if d.err == nil && n != len(x.s.stages) {
		return fmt.Errorf("%w: operator %q: %d stages, %d loaded", ErrStagesDiffer, x.s.name, n, len(x.s.stages))
	}
	parts := make([][]byte, 0, n)
	for _, st := range x.s.stages {
		from, b := d.uvarint(), d.str()
		if d.err == nil && from != st.from {
			return fmt.Errorf("%w: operator %q: a stage from epoch %d, loaded %d", ErrStagesDiffer, x.s.name, from, st.from)
		}
		parts = append(parts, []byte(b))
	}
	if err := d.finish(); err != nil {
		return err
	}
	for i, st := range x.s.stages {
		if err := st.va.st.RestoreSlots(parts[i]); err != nil {
			return err
		}
	}
	return nil
}

func (x stagedSlots) DropSlots(set slots.Set) {
	for _, st := range x.s.stages {
		st.va.st.DropSlots(set)
	}
}

// AlignCut rounds a plan's cut up to the next boundary of the windows of
// the aggregates it reshapes, so that no tumbling window of the old shape
// or the new one straddles it (see StagedAggregate): slides holds each
// reshaped aggregate's old and new window slide (its size when tumbling)
// in nanoseconds. The alignment is the least common multiple of the
// slides, or the largest slide when that multiple exceeds a day: a switch
// is delayed by less than the alignment in stream time.
func AlignCut(cut int64, slides []int64) int64 {
	const maxAlign = int64(24 * time.Hour)
	align := int64(1)
	largest := int64(1)
	for _, s := range slides {
		if s <= 0 {
			continue
		}
		largest = max(largest, s)
		g := gcd(align, s)
		if align/g > maxAlign/s {
			align = 0 // over a day (or overflowing)
			break
		}
		align = align / g * s
	}
	if align == 0 {
		align = largest
	}
	if align <= 1 {
		return cut
	}
	r := floorDiv(cut, align) * align
	if r == cut {
		return cut
	}
	if r > (1<<63-1)-align {
		return cut
	}
	return r + align
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
