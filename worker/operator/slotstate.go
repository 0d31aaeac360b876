package operator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/slots"
)

// ErrNotKeyed is returned by slot-state calls on an operator whose state is
// not split by key (filter, map, split, union, an aggregate without
// group_by): its state moves whole, with Snapshot and Restore.
var ErrNotKeyed = errors.New("operator state is not keyed by slot")

// ErrSlotConflict is returned by RestoreSlots when the snapshot holds
// slots the operator already holds state for: two copies of a slot's
// state would be merged, double counting, so it is refused (see SlotState).
var ErrSlotConflict = errors.New("operator already holds state for a slot being restored")

// ErrWatermarkMismatch is returned by RestoreSlots when the snapshot was
// taken at another watermark than the operator's (see SlotState).
var ErrWatermarkMismatch = errors.New("slot snapshot taken at another watermark")

// SlotState is the state of a keyed operator (an aggregate with group_by,
// a join) organised by hash slot (queryspec.Slot of the key values, the
// same slot the upstream routes by), so that the state of a set of slots
// can move to another copy of the operator on its own: the step a rescale
// (slots of a partition split between two, or two partitions' slots
// merged) and a move are built from.
//
// What is per slot and what is not: the groups (aggregate) and buffered
// tuples (join) of every open window belong to their key's slot. The
// watermark, and with it which windows are open and which were emitted,
// belongs to the operator: windows close, and aggregates emit, when the
// operator advances, for all slots at once. A slot snapshot carries the
// slots' groups of every open window plus the operator's watermark; it
// does not carry the late-tuple count, which stays with the operator
// that counted.
//
// Rules, chosen so that results stay exact:
//   - RestoreSlots refuses (ErrSlotConflict) a snapshot holding a slot the
//     operator already holds state for. A slot has one owner; two copies
//     of its state means the plan was wrong, and merging (double counting)
//     or replacing (losing what the operator accumulated) would both
//     corrupt results silently. The operator cannot tell which slots it is
//     assigned, only which it holds state for: the owner map is the
//     coordinator's (it never sends a slot's tuples to two partitions).
//   - Snapshots merge only at one watermark (else ErrWatermarkMismatch).
//     An operator that never advanced and holds nothing (a new copy)
//     takes the first snapshot's watermark. Merging at different
//     watermarks cannot be exact: taking the higher one would drop as late
//     the lower snapshot's tuples still to come, taking the lower one
//     would let windows the higher one already emitted be emitted again.
//     A rescale therefore cuts every involved copy at the same stream
//     time (the same release step), as an aligned checkpoint does.
//
// With those, splitting a partition's slots S into S1 and S2 (two new
// copies each restoring one part, cut at watermark W and fed the routed
// rest of the input after W) emits, window by window, exactly the rows
// the unsplit operator emits, divided between the two; merging is the
// reverse. A move is a split into one part.
type SlotState interface {
	// HeldSlots returns the slots the operator holds any state for.
	HeldSlots() slots.Set
	// SnapshotSlots encodes the state of the given slots (and the
	// operator's watermark). The operator is unchanged.
	SnapshotSlots(s slots.Set) ([]byte, error)
	// RestoreSlots installs a snapshot taken by SnapshotSlots of an
	// operator of the same definition, alongside the state held. On error
	// nothing changes.
	RestoreSlots(data []byte) error
	// DropSlots discards the state of the given slots (after they were
	// handed to another copy).
	DropSlots(s slots.Set)
}

// SlotStateOf returns op's slot-addressed state: an aggregate with
// group_by or a join, alone or heading a chain (the operators fused after
// a head are stateless). ok is false for operators whose state is not
// keyed: those move whole, with Snapshot and Restore.
func SlotStateOf(op Operator) (st SlotState, ok bool) {
	if c, isChain := op.(*chain); isChain {
		op = c.ops[0]
	}
	switch o := op.(type) {
	case *aggregate:
		if o.keyed {
			return o, true
		}
	case *join:
		return o, true
	case *VersionedAggregate:
		// The shared state, every column: a copy that loaded the same
		// versions has the same signature. Window epochs are not part of
		// it (a slot state installed during a plan gives its windows the
		// floor's version).
		if o.st.keyed {
			return o.st, true
		}
	case *VersionedJoin:
		// The shared buffers; the tuples' configurations are not part of
		// a slot state (installed ones count as the floor's).
		return o.j, true
	case *StagedAggregate:
		if !o.stages[len(o.stages)-1].va.st.keyed {
			return nil, false
		}
		if len(o.stages) == 1 {
			return o.stages[0].va.st, true
		}
		// Every stage's groups of the slots (the watermark is shared).
		return stagedSlots{o}, true
	}
	return nil, false
}

// slotIndex lists the keys of a window's groups by hash slot. Groups are
// created once per (window, key), so maintaining it costs one slot hash
// per new group, nothing per tuple.
type slotIndex map[uint16][]string

func (x slotIndex) add(slot int, key string) {
	x[uint16(slot)] = append(x[uint16(slot)], key)
}

// addFrom is add for a restore of many groups: a slot's first key gets a
// list of capacity one carved from room (which has room for every key
// still to come), one allocation for a window's lists instead of one per
// slot. A second key in the slot reallocates its list, as add does.
func (x slotIndex) addFrom(slot int, key string, room *[]string) {
	s := uint16(slot)
	if l, ok := x[s]; ok || len(*room) == 0 {
		x[s] = append(l, key)
		return
	}
	r := *room
	r[0] = key
	x[s], *room = r[:1:1], r[1:]
}

// addTo adds the index's slots to s.
func (x slotIndex) addTo(s *slots.Set) {
	for slot := range x {
		s.Add(int(slot))
	}
}

// keysIn returns the keys of groups in the slots of s, sorted, visiting
// the index or s, whichever is smaller: never every group.
func (x slotIndex) keysIn(s slots.Set) []string {
	var keys []string
	if n := s.Len(); len(x) <= n {
		for slot, ks := range x {
			if s.Has(int(slot)) {
				keys = append(keys, ks...)
			}
		}
	} else {
		for slot := range s.Slots() {
			keys = append(keys, x[uint16(slot)]...)
		}
	}
	slices.Sort(keys)
	return keys
}

// drop removes the slots of s from the index and returns their keys.
func (x slotIndex) drop(s slots.Set) []string {
	keys := x.keysIn(s)
	for slot := range x {
		if s.Has(int(slot)) {
			delete(x, slot)
		}
	}
	return keys
}

// slotSignature marks slot snapshots, so that Restore refuses one and
// RestoreSlots refuses a whole-operator snapshot.
func slotSignature(signature string) string { return "slots " + signature }

func encodeSet(e *encoder, s slots.Set) {
	b, _ := s.MarshalBinary() // never fails
	e.str(string(b))
}

func decodeSet(d *decoder) slots.Set {
	raw := d.str()
	var s slots.Set
	if d.err == nil {
		if err := s.UnmarshalBinary([]byte(raw)); err != nil {
			d.err = fmt.Errorf("%w: slot set: %w", ErrBadSnapshot, err)
		}
	}
	return s
}

// openSlotSnapshot reads the header of a slot snapshot made for an
// operator of signature (its watermark and slot set) and applies
// SlotState's rules against the operator, which holds held at watermark
// (empty: it holds no window). The decoder is left at the windows.
func openSlotSnapshot(data []byte, signature string, held slots.Set, watermark int64, empty bool) (d *decoder, snapWatermark int64, set slots.Set, err error) {
	if d, err = newDecoder(data, slotSignature(signature)); err != nil {
		return nil, 0, set, err
	}
	snapWatermark = d.varint()
	set = decodeSet(d)
	if d.err != nil {
		return nil, 0, set, d.err
	}
	return d, snapWatermark, set, checkRestore(held, set, watermark, snapWatermark, empty)
}

// checkRestore applies SlotState's rules: the snapshot's slots must not be
// held, and its watermark must be the operator's unless the operator is
// new (never advanced, holds nothing).
func checkRestore(held, incoming slots.Set, watermark, snapWatermark int64, empty bool) error {
	if both := held.Intersect(incoming); !both.IsEmpty() {
		return fmt.Errorf("%w: slots %s", ErrSlotConflict, both)
	}
	if fresh := watermark == math.MinInt64 && empty; !fresh && watermark != snapWatermark {
		return fmt.Errorf("%w: snapshot at %d, operator at %d", ErrWatermarkMismatch, snapWatermark, watermark)
	}
	return nil
}

// --- aggregate ---

func (a *aggregate) HeldSlots() slots.Set {
	var s slots.Set
	for _, w := range a.windows {
		w.bySlot.addTo(&s)
	}
	return s
}

// SnapshotSlots encodes the watermark, the slot set, and per open window
// (in start order) the groups of those slots in key order, each as
// Snapshot encodes it.
func (a *aggregate) SnapshotSlots(s slots.Set) ([]byte, error) {
	if !a.keyed {
		return nil, fmt.Errorf("%w: aggregate without group_by", ErrNotKeyed)
	}
	e := newEncoder(slotSignature(a.signature))
	e.varint(a.watermark)
	encodeSet(e, s)
	type part struct {
		w    *aggWindow
		keys []string
	}
	var parts []part
	for _, start := range slices.Sorted(maps.Keys(a.windows)) {
		w := a.windows[start]
		if keys := w.bySlot.keysIn(s); len(keys) > 0 {
			parts = append(parts, part{w, keys})
		}
	}
	e.uvarint(uint64(len(parts)))
	for _, p := range parts {
		e.varint(p.w.start)
		e.uvarint(uint64(len(p.keys)))
		for _, k := range p.keys {
			a.encodeGroup(e, k, p.w.groups[k])
		}
	}
	return e.b, nil
}

func (a *aggregate) RestoreSlots(data []byte) error {
	if !a.keyed {
		return fmt.Errorf("%w: aggregate without group_by", ErrNotKeyed)
	}
	d, watermark, set, err := openSlotSnapshot(data, a.signature, a.HeldSlots(), a.watermark, len(a.windows) == 0)
	if err != nil {
		return err
	}
	incoming := map[int64]*aggWindow{}
	nw := d.count(2)
	for range nw {
		w := a.newWindow(d.varint())
		if _, dup := incoming[w.start]; dup || w.start+a.size <= watermark {
			return fmt.Errorf("%w: window at %d repeated or already closed at watermark %d", ErrBadSnapshot, w.start, watermark)
		}
		ng := d.count(2)
		w.groups = make(map[string]*aggGroup, ng)
		sl := groupSlab{left: ng}
		for range ng {
			key, g, err := a.decodeGroup(d, &sl)
			if err != nil {
				return err
			}
			slot := queryspec.Slot(g.keyVals)
			if !set.Has(slot) {
				return fmt.Errorf("%w: group in slot %d, outside the snapshot's slots", ErrBadSnapshot, slot)
			}
			w.groups[key] = g
			w.bySlot.add(slot, key)
		}
		incoming[w.start] = w
	}
	if err := d.finish(); err != nil {
		return err
	}
	// Install. No key can exist already: its slot would be held.
	for start, in := range incoming {
		w, ok := a.windows[start]
		if !ok {
			a.windows[start] = in
			continue
		}
		for k, g := range in.groups {
			w.groups[k] = g
		}
		for slot, keys := range in.bySlot {
			w.bySlot[slot] = keys
		}
	}
	a.watermark, a.lastWin = watermark, nil
	return nil
}

func (a *aggregate) DropSlots(s slots.Set) {
	for start, w := range a.windows {
		if w.bySlot == nil {
			continue
		}
		for _, k := range w.bySlot.drop(s) {
			delete(w.groups, k)
		}
		if len(w.groups) == 0 {
			delete(a.windows, start)
		}
	}
	a.lastWin = nil
}

// --- join ---

func (j *join) HeldSlots() slots.Set {
	var s slots.Set
	for _, w := range j.windows {
		w.bySlot.addTo(&s)
	}
	return s
}

// SnapshotSlots encodes the watermark, the slot set, and per open window
// (in index order) the groups of those slots in key order, each side's
// tuples in arrival order, as Snapshot encodes them.
func (j *join) SnapshotSlots(s slots.Set) ([]byte, error) {
	e := newEncoder(slotSignature(j.signature))
	e.varint(j.watermark)
	encodeSet(e, s)
	type part struct {
		idx  int64
		keys []string
	}
	var parts []part
	for _, idx := range slices.Sorted(maps.Keys(j.windows)) {
		if keys := j.windows[idx].bySlot.keysIn(s); len(keys) > 0 {
			parts = append(parts, part{idx, keys})
		}
	}
	e.uvarint(uint64(len(parts)))
	for _, p := range parts {
		w := j.windows[p.idx]
		e.varint(p.idx)
		e.uvarint(uint64(len(p.keys)))
		for _, k := range p.keys {
			j.encodeGroup(e, k, w.groups[k])
		}
	}
	return e.b, nil
}

func (j *join) RestoreSlots(data []byte) error {
	d, watermark, set, err := openSlotSnapshot(data, j.signature, j.HeldSlots(), j.watermark, len(j.windows) == 0)
	if err != nil {
		return err
	}
	incoming := map[int64]*joinWindow{}
	nw := d.count(2)
	for range nw {
		idx := d.varint()
		if _, dup := incoming[idx]; dup || (idx+1)*j.size <= watermark {
			return fmt.Errorf("%w: window %d repeated or already closed at watermark %d", ErrBadSnapshot, idx, watermark)
		}
		w := newJoinWindow()
		ng := d.count(3)
		for range ng {
			key, g, slot, err := j.decodeGroup(d)
			if err != nil {
				return err
			}
			if !set.Has(slot) {
				return fmt.Errorf("%w: group in slot %d, outside the snapshot's slots", ErrBadSnapshot, slot)
			}
			w.groups[key] = g
			w.bySlot.add(slot, key)
		}
		incoming[idx] = w
	}
	if err := d.finish(); err != nil {
		return err
	}
	for idx, in := range incoming {
		w, ok := j.windows[idx]
		if !ok {
			j.windows[idx] = in
			continue
		}
		for k, g := range in.groups {
			w.groups[k] = g
		}
		for slot, keys := range in.bySlot {
			w.bySlot[slot] = keys
		}
	}
	j.watermark = watermark
	return nil
}

func (j *join) DropSlots(s slots.Set) {
	for idx, w := range j.windows {
		for _, k := range w.bySlot.drop(s) {
			delete(w.groups, k)
		}
		if len(w.groups) == 0 {
			delete(j.windows, idx)
		}
	}
}
