package operator

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// storedTuple is a deep copy of one join input kept until its window ends.
type storedTuple struct {
	stime     int64
	tentative bool
	values    []tuple.Value
	// epoch is the configuration the tuple belongs to (its tag, under a
	// VersionedJoin; 0 otherwise): a pair is produced by the version of
	// the newer of its two tuples' configurations.
	epoch uint64
}

// joinGroup holds both sides' tuples of one key in one window, in arrival
// order (which is deterministic, so match order is too).
type joinGroup struct {
	sides [2][]storedTuple // 0 = left, 1 = right
}

type joinWindow struct {
	groups map[string]*joinGroup // by key encoding of the `on` fields
	// bySlot indexes the keys of groups by their hash slot (see
	// aggWindow.bySlot): a join is always keyed.
	bySlot slotIndex
}

func newJoinWindow() *joinWindow {
	return &joinWindow{groups: map[string]*joinGroup{}, bySlot: slotIndex{}}
}

// join is a windowed equi-join: a left and a right tuple match when their
// `on` fields are equal and they fall in the same tumbling window
// [k*size, (k+1)*size). Each match is emitted when its second tuple
// arrives; Advance drops windows that have ended.
type join struct {
	schemas   [2]*tuple.Schema
	keys      [2][]int // `on` field indexes per side
	rightKeep []int    // right fields that are not join keys, in order
	outSch    *tuple.Schema
	size      int64
	signature string

	windows   map[int64]*joinWindow // by window index
	watermark int64
	late      uint64

	keyBuf  []byte
	slotBuf []tuple.Value // the key values of a new group, for its slot
	out     tuple.Tuple

	// where is the optional predicate over a matched pair's output (nil:
	// every pair); pred is the one in use (a VersionedJoin sets the
	// version's before each tuple).
	where, pred *joinPredicate
	// Under a VersionedJoin: epochOf is the configuration of the tuple in
	// process, versions the predicate of a configuration's version.
	epochOf  uint64
	versions func(epoch uint64) *joinPredicate
}

// joinPredicate is a join's `where`, compiled over its output schema.
type joinPredicate struct {
	env  *exprEnv
	expr *compiledExpr
}

// keep evaluates the predicate on an output pair; an evaluation error
// drops the pair, as a filter's would drop the tuple.
func (p *joinPredicate) keep(t *tuple.Tuple) (bool, error) {
	if err := p.env.bind(t); err != nil {
		return false, err
	}
	return p.env.evalBool(p.expr, t)
}

func newJoinPredicate(def *queryspec.Operator, out *tuple.Schema) (*joinPredicate, error) {
	if def.Where == "" {
		return nil, nil
	}
	env := newExprEnv(out)
	e, err := env.compile(def.Where, true)
	if err != nil {
		return nil, fmt.Errorf("operator %q (join): where %q: %w: %w", def.Name, def.Where, ErrBadExpression, err)
	}
	return &joinPredicate{env: env, expr: e}, nil
}

func newJoin(def *queryspec.Operator, left, right *tuple.Schema) (*join, error) {
	size, _, err := parseWindow(def, false)
	if err != nil {
		return nil, err
	}
	if len(def.On) == 0 {
		return nil, defErr(def, ErrBadDefinition, "on is required (the equi-join key fields)")
	}
	j := &join{
		schemas:   [2]*tuple.Schema{left, right},
		size:      size,
		windows:   map[int64]*joinWindow{},
		watermark: math.MinInt64,
	}
	isKey := map[string]bool{}
	for _, name := range def.On {
		if isKey[name] {
			return nil, defErr(def, ErrBadDefinition, "on lists %q twice", name)
		}
		isKey[name] = true
		li, ri := left.Index(name), right.Index(name)
		if li < 0 {
			return nil, defErr(def, ErrUnknownField, "on field %q is not in the left schema %s", name, schemaSignature(left))
		}
		if ri < 0 {
			return nil, defErr(def, ErrUnknownField, "on field %q is not in the right schema %s", name, schemaSignature(right))
		}
		if lk, rk := left.Fields[li].Kind, right.Fields[ri].Kind; lk != rk {
			return nil, defErr(def, ErrTypeMismatch, "on field %q is %s on the left but %s on the right", name, lk, rk)
		}
		j.keys[0] = append(j.keys[0], li)
		j.keys[1] = append(j.keys[1], ri)
	}
	fields := slices.Clone(left.Fields)
	for i, f := range right.Fields {
		if isKey[f.Name] {
			continue
		}
		name := f.Name
		if left.Index(name) >= 0 {
			name = "right_" + name
		}
		if slices.ContainsFunc(fields, func(g tuple.Field) bool { return g.Name == name }) {
			return nil, defErr(def, ErrBadDefinition, "right field %q would be output as %q, which already exists", f.Name, name)
		}
		fields = append(fields, tuple.Field{Name: name, Kind: f.Kind})
		j.rightKeep = append(j.rightKeep, i)
	}
	j.outSch = tuple.NewSchema(fields)
	j.out.Values = make([]tuple.Value, 0, len(fields))
	j.signature = fmt.Sprintf("join%s%s on=%v size=%d", schemaSignature(left), schemaSignature(right), def.On, size)
	if j.where, err = newJoinPredicate(def, j.outSch); err != nil {
		return nil, err
	}
	j.pred = j.where
	return j, nil
}

func (j *join) Process(port int, t *tuple.Tuple, out Emitter) error {
	if port != 0 && port != 1 {
		return fmt.Errorf("%w: join has ports 0 (left) and 1 (right), got %d", ErrBadPort, port)
	}
	schema := j.schemas[port]
	if err := checkData(t, schema); err != nil {
		return err
	}
	if err := checkKinds(t, schema); err != nil {
		return err
	}
	if t.STime < j.watermark {
		j.late++
		return nil
	}
	j.keyBuf = j.keyBuf[:0]
	for _, i := range j.keys[port] {
		j.keyBuf = appendKeyValue(j.keyBuf, t.Values[i])
	}
	idx := floorDiv(t.STime, j.size)
	w, ok := j.windows[idx]
	if !ok {
		w = newJoinWindow()
		j.windows[idx] = w
	}
	g, ok := w.groups[string(j.keyBuf)]
	if !ok {
		g = &joinGroup{}
		key := string(j.keyBuf)
		w.groups[key] = g
		j.slotBuf = j.slotBuf[:0]
		for _, i := range j.keys[port] {
			j.slotBuf = append(j.slotBuf, t.Values[i])
		}
		w.bySlot.add(queryspec.Slot(j.slotBuf), key)
	}
	mine := storedTuple{stime: t.STime, tentative: t.Type == tuple.Tentative, values: make([]tuple.Value, schema.Len()), epoch: j.epochOf}
	for i := range mine.values {
		mine.values[i] = cloneValue(t.Values[i])
	}
	g.sides[port] = append(g.sides[port], mine)
	var failed error
	for i := range g.sides[1-port] {
		other := &g.sides[1-port][i]
		version := t.Version
		if j.versions != nil {
			version = max(mine.epoch, other.epoch)
			j.pred = j.versions(version)
		}
		var err error
		if port == 0 {
			err = j.emit(&mine, other, version, out)
		} else {
			err = j.emit(other, &mine, version, out)
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	if failed != nil {
		// The pairs whose predicate failed are dropped (counted by the
		// task, as a filter's); the tuple itself is stored.
		return fmt.Errorf("where: %w", failed)
	}
	return nil
}

func (j *join) emit(left, right *storedTuple, version uint64, out Emitter) error {
	vals := append(j.out.Values[:0], left.values...)
	for _, i := range j.rightKeep {
		vals = append(vals, right.values[i])
	}
	j.out = tuple.Tuple{Type: tuple.Stable, STime: max(left.stime, right.stime), Version: version, Values: vals}
	if left.tentative || right.tentative {
		j.out.Type = tuple.Tentative
	}
	if j.pred != nil {
		keep, err := j.pred.keep(&j.out)
		if err != nil || !keep {
			return err
		}
	}
	out.Emit(&j.out)
	return nil
}

// Advance drops every window that ended at or before watermark.
func (j *join) Advance(watermark int64, _ Emitter) error {
	if watermark <= j.watermark {
		return nil
	}
	j.watermark = watermark
	for idx := range j.windows {
		if (idx+1)*j.size <= watermark {
			delete(j.windows, idx)
		}
	}
	return nil
}

// LateTuples counts tuples dropped because their STime was below the
// watermark.
func (j *join) LateTuples() uint64 { return j.late }

func (j *join) OutputSchema() *tuple.Schema { return j.outSch }

// Snapshot encodes watermark, late count and every open window in index
// order, groups in key order, each side's tuples in arrival order.
func (j *join) Snapshot() ([]byte, error) {
	e := newEncoder(j.signature)
	e.varint(j.watermark)
	e.uvarint(j.late)
	idxs := slices.Sorted(maps.Keys(j.windows))
	e.uvarint(uint64(len(idxs)))
	for _, i := range idxs {
		w := j.windows[i]
		e.varint(i)
		keys := slices.Sorted(maps.Keys(w.groups))
		e.uvarint(uint64(len(keys)))
		for _, k := range keys {
			j.encodeGroup(e, k, w.groups[k])
		}
	}
	return e.b, nil
}

// encodeGroup writes one group: key encoding, then each side's tuples.
func (j *join) encodeGroup(e *encoder, key string, g *joinGroup) {
	e.str(key)
	for _, side := range g.sides {
		e.uvarint(uint64(len(side)))
		for _, st := range side {
			e.varint(st.stime)
			e.bool(st.tentative)
			for _, v := range st.values {
				e.value(v)
			}
		}
	}
}

// decodeGroup reads what encodeGroup wrote and returns the group's key
// with its slot (the hash slot of the key values).
func (j *join) decodeGroup(d *decoder) (string, *joinGroup, int, error) {
	key := d.str()
	g := &joinGroup{}
	for side := range g.sides {
		n := d.count(2)
		g.sides[side] = make([]storedTuple, n)
		for i := range n {
			st := &g.sides[side][i]
			st.stime = d.varint()
			st.tentative = d.bool()
			st.values = make([]tuple.Value, j.schemas[side].Len())
			for v := range st.values {
				st.values[v] = d.value()
			}
		}
	}
	if d.err != nil {
		return "", nil, 0, d.err
	}
	vals, err := decodeKey(key, len(j.keys[0]))
	if err != nil {
		return "", nil, 0, err
	}
	return key, g, queryspec.Slot(vals), nil
}

// Restore replaces all state with the snapshot's.
func (j *join) Restore(state []byte) error {
	d, err := newDecoder(state, j.signature)
	if err != nil {
		return err
	}
	watermark := d.varint()
	late := d.uvarint()
	windows := map[int64]*joinWindow{}
	nw := d.count(2)
	for range nw {
		idx := d.varint()
		w := newJoinWindow()
		ng := d.count(3)
		for range ng {
			key, g, slot, err := j.decodeGroup(d)
			if err != nil {
				return err
			}
			w.groups[key] = g
			w.bySlot.add(slot, key)
		}
		windows[idx] = w
	}
	if err := d.finish(); err != nil {
		return err
	}
	j.watermark, j.late, j.windows = watermark, late, windows
	return nil
}
