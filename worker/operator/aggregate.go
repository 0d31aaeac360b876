package operator

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// WindowEndField is the last field of every aggregate output: the exclusive
// end of the window the row summarises (also the row's STime).
const WindowEndField = "window_end"

type aggFunc uint8

const (
	aggCount aggFunc = iota
	aggSum
	aggAvg
	aggMin
	aggMax
	aggCountDistinct
)

var aggFuncNames = map[string]aggFunc{
	"count": aggCount, "sum": aggSum, "avg": aggAvg,
	"min": aggMin, "max": aggMax, "count_distinct": aggCountDistinct,
}

// aggSpec is one parsed "fn(field)" entry.
type aggSpec struct {
	name  string
	fn    aggFunc
	field int        // input index; -1 for count()
	kind  tuple.Kind // the input field's kind
	out   tuple.Kind
	src   string // canonical "fn(field)", for the snapshot signature
}

// accumulator holds one aggregate of one group in one window. Which fields
// are live depends on the aggregate: count always; sumI or sumF (by input
// kind) for sum and avg; ext for min and max; distinct for count_distinct,
// whose members are key encodings of the values.
type accumulator struct {
	count    int64
	sumI     int64
	sumF     float64
	ext      tuple.Value
	distinct map[string]struct{}
	// distinctShared: distinct is shared with a frozen copy of the state
	// (Freeze), which reads it while it is encoded: it is cloned before
	// the next member is added, so the task never writes a map a frozen
	// copy reads, and the freeze itself, which holds the task, clones
	// nothing.
	distinctShared bool
}

// aggGroup is one group of one window. keyVals are deep copies.
type aggGroup struct {
	keyVals   []tuple.Value
	tentative bool // some contributing tuple was Tentative
	accs      []accumulator
}

// aggWindow is the window [start, start+size).
type aggWindow struct {
	start  int64
	groups map[string]*aggGroup // by key encoding of keyVals
	// bySlot indexes the keys of groups by their hash slot (keyed
	// aggregates only, nil otherwise), so the state of a set of slots is
	// found without scanning every group. It is maintained when a group
	// is created (not per tuple) and holds exactly the keys of groups.
	bySlot slotIndex
	// epoch is the newest configuration whose tuples the window holds
	// (VersionedAggregate only; 0 otherwise).
	epoch uint64
}

// aggregate is a windowed group-by aggregate on stime. Windows are aligned
// to the epoch: [k*slide, k*slide+size). A window exists only while it has
// rows and has not been emitted; Advance emits and drops every window whose
// end is <= the watermark, so state is bounded by the open windows.
type aggregate struct {
	in        *tuple.Schema
	outSch    *tuple.Schema
	size      int64
	slide     int64
	groupBy   []int
	specs     []aggSpec
	checked   []int // input fields whose kind Process verifies
	signature string
	name      string
	// intSums are the specs that add up an int field (sum, avg): a tuple
	// that would take one of their sums past the int64 range is dropped
	// (ErrSumOverflow) instead of wrapping around.
	intSums []int
	// sumBound is at least the magnitude of every int running sum held
	// (it never decreases): a tuple whose values' magnitudes stay within
	// MaxInt64 - sumBound cannot overflow, so only the rare tuple that
	// might is checked group by group (see mayOverflow).
	sumBound uint64

	windows   map[int64]*aggWindow // by start
	watermark int64                // highest Advance so far; math.MinInt64 before any
	late      uint64
	// keyed: the aggregate groups by key, so its state is split by hash
	// slot (see SlotState); without group_by it has one group per window
	// and its state is extract-all only.
	keyed bool

	lastWin *aggWindow // the window the previous tuple went to (tumbling fast path)
	// Every stime in [rangeFrom, rangeTo) is in the windows kFrom..kTo
	// (window k starts at k*slide): the previous tuple's, kept so that the
	// next tuples, nearly always in the same range, skip two divisions.
	// Empty (from == to) until the first tuple.
	rangeFrom, rangeTo, kFrom, kTo int64
	keyBuf                         []byte
	// members holds, per aggregate (count_distinct only), the current
	// tuple's member: its key encoding computed once per tuple, and the
	// string allocated once, on its first insertion, and shared by every
	// window the tuple goes to (a 2 s window sliding every 5 ms puts each
	// tuple in 400 windows: one encoding and one allocation instead of
	// 400 of each).
	members []tupleMember
	out     tuple.Tuple
	// cols, when not nil, are the specs a tuple updates (the functions of
	// the version processing it, VersionedAggregate); nil: all of them.
	cols []int
}

// tupleMember is the current tuple's count_distinct member (see
// aggregate.members); done is false until it is encoded for this tuple.
type tupleMember struct {
	enc  []byte
	str  string
	done bool
}

func newAggregate(def *queryspec.Operator, in *tuple.Schema) (*aggregate, error) {
	size, slide, err := parseWindow(def, true)
	if err != nil {
		return nil, err
	}
	if len(def.Aggregates) == 0 {
		return nil, defErr(def, ErrBadDefinition, "aggregates is required")
	}
	a := &aggregate{in: in, size: size, slide: slide, windows: map[int64]*aggWindow{}, watermark: math.MinInt64, name: def.Name}
	var fields []tuple.Field
	names := map[string]bool{WindowEndField: true}
	checked := map[int]bool{}
	for _, g := range def.GroupBy {
		i := in.Index(g)
		if i < 0 {
			return nil, defErr(def, ErrUnknownField, "group_by %q is not in the input schema %s", g, schemaSignature(in))
		}
		if names[g] {
			return nil, defErr(def, ErrBadDefinition, "group_by %q is listed twice or collides with %q", g, WindowEndField)
		}
		names[g] = true
		a.groupBy = append(a.groupBy, i)
		a.keyed = true
		checked[i] = true
		fields = append(fields, in.Fields[i])
	}
	for _, ne := range def.Aggregates {
		spec, err := parseAggSpec(def, in, ne)
		if err != nil {
			return nil, err
		}
		if names[ne.Name] {
			return nil, defErr(def, ErrBadDefinition, "aggregate name %q collides with another output field", ne.Name)
		}
		names[ne.Name] = true
		if spec.field >= 0 {
			checked[spec.field] = true
		}
		if (spec.fn == aggSum || spec.fn == aggAvg) && spec.kind == tuple.KindInt {
			a.intSums = append(a.intSums, len(a.specs))
		}
		a.specs = append(a.specs, spec)
		fields = append(fields, tuple.Field{Name: spec.name, Kind: spec.out})
	}
	a.members = make([]tupleMember, len(a.specs))
	fields = append(fields, tuple.Field{Name: WindowEndField, Kind: tuple.KindTimestamp})
	for i := range checked {
		a.checked = append(a.checked, i)
	}
	slices.Sort(a.checked)
	a.outSch = tuple.NewSchema(fields)
	a.out.Values = make([]tuple.Value, 0, len(fields))
	var sig strings.Builder
	fmt.Fprintf(&sig, "aggregate%s size=%d slide=%d group_by=%v", schemaSignature(in), size, slide, def.GroupBy)
	for _, s := range a.specs {
		fmt.Fprintf(&sig, " %s=%s", s.name, s.src)
	}
	a.signature = sig.String()
	return a, nil
}

// parseAggSpec reads "fn(field)" (or "count()") and checks the field's kind.
func parseAggSpec(def *queryspec.Operator, in *tuple.Schema, ne queryspec.NamedExpr) (aggSpec, error) {
	if ne.Name == "" {
		return aggSpec{}, defErr(def, ErrBadDefinition, "aggregate %q has no name", ne.Expr)
	}
	src := strings.TrimSpace(ne.Expr)
	open := strings.IndexByte(src, '(')
	if open < 0 || !strings.HasSuffix(src, ")") {
		return aggSpec{}, defErr(def, ErrBadDefinition, "aggregate %q = %q: want fn(field), e.g. count() or sum(bytes)", ne.Name, ne.Expr)
	}
	fnName := strings.ToLower(strings.TrimSpace(src[:open]))
	arg := strings.TrimSpace(src[open+1 : len(src)-1])
	fn, ok := aggFuncNames[fnName]
	if !ok {
		return aggSpec{}, defErr(def, ErrBadDefinition, "aggregate %q = %q: unknown function %q (want count, sum, avg, min, max or count_distinct)", ne.Name, ne.Expr, fnName)
	}
	spec := aggSpec{name: ne.Name, fn: fn, field: -1, src: fnName + "(" + arg + ")"}
	if fn == aggCount && (arg == "" || arg == "*") {
		spec.out = tuple.KindInt
		return spec, nil
	}
	if arg == "" {
		return aggSpec{}, defErr(def, ErrBadDefinition, "aggregate %q = %q: %s needs a field", ne.Name, ne.Expr, fnName)
	}
	spec.field = in.Index(arg)
	if spec.field < 0 {
		return aggSpec{}, defErr(def, ErrUnknownField, "aggregate %q = %q: field %q is not in the input schema %s", ne.Name, ne.Expr, arg, schemaSignature(in))
	}
	spec.kind = in.Fields[spec.field].Kind
	numeric := spec.kind == tuple.KindInt || spec.kind == tuple.KindFloat
	switch fn {
	case aggCount, aggCountDistinct:
		spec.out = tuple.KindInt
	case aggSum:
		if !numeric {
			return aggSpec{}, defErr(def, ErrTypeMismatch, "aggregate %q = %q: sum needs an int or float field, %q is %s", ne.Name, ne.Expr, arg, spec.kind)
		}
		spec.out = spec.kind
	case aggAvg:
		if !numeric {
			return aggSpec{}, defErr(def, ErrTypeMismatch, "aggregate %q = %q: avg needs an int or float field, %q is %s", ne.Name, ne.Expr, arg, spec.kind)
		}
		spec.out = tuple.KindFloat
	case aggMin, aggMax:
		spec.out = spec.kind
	}
	return spec, nil
}

func (a *aggregate) Process(port int, t *tuple.Tuple, out Emitter) error {
	if port != 0 {
		return fmt.Errorf("%w: aggregate has port 0 only, got %d", ErrBadPort, port)
	}
	if err := checkData(t, a.in); err != nil {
		return err
	}
	for _, i := range a.checked {
		if k := t.Values[i].Kind; k != a.in.Fields[i].Kind {
			return fmt.Errorf("%w: field %q is %s, schema says %s", ErrTypeMismatch, a.in.Fields[i].Name, k, a.in.Fields[i].Kind)
		}
	}
	if t.STime < a.watermark {
		a.late++
		return nil
	}
	a.keyBuf = a.keyBuf[:0]
	for _, i := range a.groupBy {
		a.keyBuf = appendKeyValue(a.keyBuf, t.Values[i])
	}
	if t.STime < a.rangeFrom || t.STime >= a.rangeTo {
		a.windowsOf(t.STime)
	}
	if len(a.intSums) > 0 && a.mayOverflow(t) {
		if err := a.checkIntSums(t); err != nil {
			return err
		}
	}
	for i := range a.members {
		a.members[i].done = false
	}
	slot := -1 // computed once per tuple, when a group is created
	for k := a.kFrom; k <= a.kTo; k++ {
		w := a.window(k * a.slide)
		g, ok := w.groups[string(a.keyBuf)]
		if !ok {
			g = a.newGroup(t)
			key := string(a.keyBuf)
			w.groups[key] = g
			if a.keyed {
				if slot < 0 {
					slot = queryspec.Slot(g.keyVals)
				}
				w.bySlot.add(slot, key)
			}
		}
		a.accumulate(g, t)
	}
	return nil
}

// mayOverflow is a cheap test that adding t to no group can overflow an
// int sum: false when every value's magnitude fits under MaxInt64 minus
// sumBound.
func (a *aggregate) mayOverflow(t *tuple.Tuple) bool {
	for _, i := range a.intSums {
		if magnitude(t.Values[a.specs[i].field].I) > math.MaxInt64-min(a.sumBound, math.MaxInt64) {
			return true
		}
	}
	return false
}

// magnitude is |v| as a uint64 (exact for math.MinInt64 too).
func magnitude(v int64) uint64 {
	if v < 0 {
		return uint64(-(v + 1)) + 1
	}
	return uint64(v)
}

// checkIntSums refuses a tuple that would take an int sum of its group,
// in any of its windows, past the int64 range: the tuple is dropped from
// the aggregate as a whole (every aggregate of the row stays over the
// same tuples), and the error (wrapping ErrSumOverflow, hence ErrEval)
// makes the task count, log and report it. Deterministic, so every
// replica drops the same tuples. Run after windowsOf, before accumulating.
func (a *aggregate) checkIntSums(t *tuple.Tuple) error {
	for k := a.kFrom; k <= a.kTo; k++ {
		w := a.windows[k*a.slide]
		if w == nil {
			continue
		}
		g := w.groups[string(a.keyBuf)]
		if g == nil {
			continue
		}
		for _, i := range a.intSums {
			s := &a.specs[i]
			sum, v := g.accs[i].sumI, t.Values[s.field].I
			if r := sum + v; (v > 0 && r < sum) || (v < 0 && r > sum) {
				return fmt.Errorf("%w: aggregate %s: %s = %s in the window ending %s: %d + %d is outside the int64 range; the tuple is dropped from the aggregate",
					ErrSumOverflow, a.name, s.name, s.src, time.Unix(0, w.start+a.size).UTC().Format(time.RFC3339Nano), sum, v)
			}
		}
	}
	return nil
}

// windowsOf sets kFrom..kTo to the windows holding stime s, and the range
// of stimes held by exactly those windows. A tuple is in every window
// [k*slide, k*slide+size) containing its stime; a tuple at a window's end
// belongs to the next window only.
func (a *aggregate) windowsOf(s int64) {
	hi := floorDiv(s, a.slide)
	lo := floorDiv(s-a.size, a.slide)
	a.kFrom, a.kTo = lo+1, hi
	// Both floors stay the same while s is in [hi*slide, (hi+1)*slide)
	// and s-size in [lo*slide, (lo+1)*slide). Far from the int64 limits
	// (which stream times in nanoseconds since 1970 are) none of these
	// products overflow; near them nothing is kept.
	const far = math.MaxInt64 / 4
	if s > far || s < -far || a.size > far || a.slide > far {
		a.rangeFrom, a.rangeTo = 0, 0
		return
	}
	a.rangeFrom = max(hi*a.slide, lo*a.slide+a.size)
	a.rangeTo = min((hi+1)*a.slide, (lo+1)*a.slide+a.size)
}

func (a *aggregate) window(start int64) *aggWindow {
	if a.lastWin != nil && a.lastWin.start == start {
		return a.lastWin
	}
	w, ok := a.windows[start]
	if !ok {
		w = a.newWindow(start)
		a.windows[start] = w
	}
	a.lastWin = w
	return w
}

func (a *aggregate) newWindow(start int64) *aggWindow {
	return a.newWindowOf(start, 0)
}

// newWindowOf is newWindow with room for n groups (a restore knows how
// many come): neither the groups nor the slot index grow, rehashing, as
// they are added.
func (a *aggregate) newWindowOf(start int64, n int) *aggWindow {
	w := &aggWindow{start: start, groups: make(map[string]*aggGroup, n)}
	if a.keyed {
		w.bySlot = make(slotIndex, n)
	}
	return w
}

func (a *aggregate) newGroup(t *tuple.Tuple) *aggGroup {
	g := &aggGroup{keyVals: make([]tuple.Value, len(a.groupBy)), accs: make([]accumulator, len(a.specs))}
	for j, i := range a.groupBy {
		g.keyVals[j] = cloneValue(t.Values[i])
	}
	return g
}

func (a *aggregate) accumulate(g *aggGroup, t *tuple.Tuple) {
	if t.Type == tuple.Tentative {
		g.tentative = true
	}
	if a.cols != nil {
		// A version's functions only (VersionedAggregate); the loop
		// below stays the unversioned hot path.
		for _, i := range a.cols {
			a.accumulateSpec(&a.specs[i], &g.accs[i], t)
		}
		return
	}
	for i := range a.specs {
		s := &a.specs[i]
		acc := &g.accs[i]
		acc.count++
		if s.field < 0 {
			continue
		}
		v := t.Values[s.field]
		switch s.fn {
		case aggSum, aggAvg:
			if s.kind == tuple.KindFloat {
				acc.sumF += v.F
			} else {
				acc.sumI += v.I
				a.sumBound = max(a.sumBound, magnitude(acc.sumI))
			}
		case aggMin:
			if acc.count == 1 || compareValues(v, acc.ext) < 0 {
				acc.ext = cloneValue(v)
			}
		case aggMax:
			if acc.count == 1 || compareValues(v, acc.ext) > 0 {
				acc.ext = cloneValue(v)
			}
		case aggCountDistinct:
			m := &a.members[i]
			if !m.done {
				m.enc, m.str, m.done = appendKeyValue(m.enc[:0], v), "", true
			}
			if acc.distinct == nil {
				acc.distinct = map[string]struct{}{}
			}
			if m.str != "" && !acc.distinctShared {
				// The member was new to an earlier window of this tuple
				// (m.str was made for it), so it is likely new to this
				// one too: inserted at once, one hash of it instead of a
				// lookup and an insert (inserting a member the set holds
				// changes nothing). In bench move's sliding windows, where
				// every member is new to each of 400 windows, a tuple
				// costs a fifth less CPU (BenchmarkCountDistinctSliding).
				// Before a member is found new, it is looked up without
				// making m.str: a member every window holds allocates
				// nothing.
				acc.distinct[m.str] = struct{}{}
			} else if _, ok := acc.distinct[string(m.enc)]; !ok {
				if acc.distinctShared {
					acc.distinct, acc.distinctShared = maps.Clone(acc.distinct), false
				}
				if m.str == "" { // a key encoding is never empty
					m.str = string(m.enc)
				}
				acc.distinct[m.str] = struct{}{}
			}
		}
	}
}

// accumulateSpec adds t to one accumulator, as accumulate's loop does
// (kept inline there: it is the hot path).
func (a *aggregate) accumulateSpec(s *aggSpec, acc *accumulator, t *tuple.Tuple) {
	acc.count++
	if s.field < 0 {
		return
	}
	v := t.Values[s.field]
	switch s.fn {
	case aggSum, aggAvg:
		if s.kind == tuple.KindFloat {
			acc.sumF += v.F
		} else {
			acc.sumI += v.I
			a.sumBound = max(a.sumBound, magnitude(acc.sumI))
		}
	case aggMin:
		if acc.count == 1 || compareValues(v, acc.ext) < 0 {
			acc.ext = cloneValue(v)
		}
	case aggMax:
		if acc.count == 1 || compareValues(v, acc.ext) > 0 {
			acc.ext = cloneValue(v)
		}
	case aggCountDistinct:
		var buf [64]byte
		enc := appendKeyValue(buf[:0], v)
		if acc.distinct == nil {
			acc.distinct = map[string]struct{}{}
		}
		if _, ok := acc.distinct[string(enc)]; !ok {
			// A set shared with a snapshot being taken is copied before
			// its first change, as in accumulate.
			if acc.distinctShared {
				acc.distinct, acc.distinctShared = maps.Clone(acc.distinct), false
			}
			acc.distinct[string(enc)] = struct{}{}
		}
	}
}

// compareValues orders two values of the same kind.
func compareValues(x, y tuple.Value) int {
	switch x.Kind {
	case tuple.KindFloat:
		switch {
		case x.F < y.F:
			return -1
		case x.F > y.F:
			return 1
		}
		return 0
	case tuple.KindString, tuple.KindBytes:
		return strings.Compare(x.S, y.S)
	}
	switch {
	case x.I < y.I:
		return -1
	case x.I > y.I:
		return 1
	}
	return 0
}

// Advance emits, oldest first, every window whose end is <= watermark, its
// groups sorted by key encoding, and drops them. A watermark below the
// highest one seen is ignored.
func (a *aggregate) Advance(watermark int64, out Emitter) error {
	a.advance(watermark, func(w *aggWindow) { a.emitWindow(w, out) })
	return nil
}

// advance raises the watermark and hands every window it closes to emit,
// oldest first, then drops it.
func (a *aggregate) advance(watermark int64, emit func(*aggWindow)) {
	if watermark <= a.watermark {
		return
	}
	a.watermark = watermark
	var closed []int64
	for start := range a.windows {
		if start+a.size <= watermark {
			closed = append(closed, start)
		}
	}
	slices.Sort(closed)
	for _, start := range closed {
		w := a.windows[start]
		emit(w)
		delete(a.windows, start)
		if a.lastWin == w {
			a.lastWin = nil
		}
	}
}

func (a *aggregate) emitWindow(w *aggWindow, out Emitter) {
	keys := make([]string, 0, len(w.groups))
	for k := range w.groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	end := w.start + a.size
	for _, k := range keys {
		g := w.groups[k]
		vals := append(a.out.Values[:0], g.keyVals...)
		for i := range a.specs {
			vals = append(vals, a.result(&a.specs[i], &g.accs[i]))
		}
		vals = append(vals, tuple.Timestamp(end))
		a.out = tuple.Tuple{Type: tuple.Stable, STime: end, Values: vals}
		if g.tentative {
			a.out.Type = tuple.Tentative
		}
		out.Emit(&a.out)
	}
}

func (a *aggregate) result(s *aggSpec, acc *accumulator) tuple.Value {
	switch s.fn {
	case aggSum:
		if s.kind == tuple.KindFloat {
			return tuple.Float(acc.sumF)
		}
		return tuple.Int(acc.sumI)
	case aggAvg:
		if s.kind == tuple.KindFloat {
			return tuple.Float(acc.sumF / float64(acc.count))
		}
		return tuple.Float(float64(acc.sumI) / float64(acc.count))
	case aggMin, aggMax:
		return acc.ext
	case aggCountDistinct:
		return tuple.Int(int64(len(acc.distinct)))
	}
	return tuple.Int(acc.count)
}

// LateTuples counts tuples dropped because their STime was below the
// watermark.
func (a *aggregate) LateTuples() uint64 { return a.late }

func (a *aggregate) OutputSchema() *tuple.Schema { return a.outSch }

// Snapshot encodes watermark, late count and every open window in start
// order, groups in key order, count_distinct members sorted.
func (a *aggregate) Snapshot() ([]byte, error) {
	return slices.Concat(a.encodeViews(a.watermark, a.late, a.views(false))...), nil
}

// windowView is one open window's groups, as Snapshot encodes them.
type windowView struct {
	start  int64
	groups []keyedGroup
}

// views lists the open windows in start order with their groups (not yet
// sorted); with copyGroups, each group is a copy that later processing
// does not change (Freeze).
func (a *aggregate) views(copyGroups bool) []windowView {
	starts := slices.Sorted(maps.Keys(a.windows))
	out := make([]windowView, len(starts))
	for i, start := range starts {
		w := a.windows[start]
		v := windowView{start: start, groups: make([]keyedGroup, 0, len(w.groups))}
		var gs []aggGroup
		var accs []accumulator
		if copyGroups {
			// One allocation for the window's groups and one for their
			// accumulators, instead of two per group.
			gs = make([]aggGroup, len(w.groups))
			accs = make([]accumulator, len(w.groups)*len(a.specs))
		}
		for k, g := range w.groups {
			if copyGroups {
				j := len(v.groups)
				c := &gs[j]
				c.keyVals, c.tentative = g.keyVals, g.tentative
				c.accs = accs[j*len(a.specs) : (j+1)*len(a.specs) : (j+1)*len(a.specs)]
				copy(c.accs, g.accs)
				// count_distinct sets are shared, not cloned here: the
				// task clones one before it adds to it (distinctShared).
				for x := range g.accs {
					if g.accs[x].distinct != nil {
						g.accs[x].distinctShared = true
					}
				}
				g = c
			}
			v.groups = append(v.groups, keyedGroup{k, g})
		}
		out[i] = v
	}
	return out
}

// encodeViews encodes watermark, late count and the windows: groups in
// key order, count_distinct members sorted. The encoding comes in parts:
// the header, then one part per window in start order (see
// prepareViews).
func (a *aggregate) encodeViews(watermark int64, late uint64, views []windowView) [][]byte {
	enc := a.prepareViews(watermark, late, views, true)
	parts := make([][]byte, 0, 1+len(views))
	if err := enc.Write(func(p []byte) error { parts = append(parts, p); return nil }); err != nil {
		panic(err) // unreachable: the emit function never fails
	}
	return parts
}

// prepareViews sizes each window's encoding exactly (on GOMAXPROCS
// goroutines), which needs no sorting: the size of a set of members does
// not depend on their order. The Encoding then writes each window into a
// buffer of that size, windows side by side (each reads only its own
// groups), sorting its groups and count_distinct members first, so the
// sorting runs while earlier windows are sent instead of before the
// first byte; no byte is copied twice and the whole size is known before
// the first byte is written.
//
// Canonical sorts each count_distinct set's members too, so that equal
// state gives equal bytes (Snapshot). A live snapshot's encoding
// (freezeEncoding) leaves them in the set's order: it is only restored,
// and a set restores the same whatever its order, while sorting the
// members was about 40% of encoding a large state's CPU
// (BenchmarkMoveStateCodec), taken from a worker whose task runs on and
// which is sending the bytes at the same time.
func (a *aggregate) prepareViews(watermark int64, late uint64, views []windowView, canonical bool) *Encoding {
	e := newEncoder(a.signature)
	e.varint(watermark)
	e.uvarint(late)
	e.uvarint(uint64(len(views)))
	head := e.b
	sizes := make([]int, len(views))
	encodeParallel(len(views), func(i int) {
		v := views[i]
		size := varintSize(v.start) + uvarintSize(uint64(len(v.groups)))
		for _, kg := range v.groups {
			size += uvarintSize(uint64(len(kg.key))) + len(kg.key) + 1
			for x := range a.specs {
				size += a.accSize(&a.specs[x], &kg.g.accs[x])
			}
		}
		sizes[i] = size
	})
	total := len(head)
	for _, n := range sizes {
		total += n
	}
	return &Encoding{Size: total, write: func(emit func([]byte) error, transient bool) error {
		if err := emit(head); err != nil {
			return err
		}
		return writeParallel(len(views), transient, func(i int, buf []byte) []byte {
			v := views[i]
			// Groups with their keys, sorted: no map lookup per group
			// after the sort.
			slices.SortFunc(v.groups, func(x, y keyedGroup) int { return strings.Compare(x.key, y.key) })
			if cap(buf) < sizes[i] {
				buf = bufferOf(sizes[i])
			}
			e := encoder{b: buf[:0]}
			e.varint(v.start)
			e.uvarint(uint64(len(v.groups)))
			var members []string
			for _, kg := range v.groups {
				e.str(kg.key)
				e.bool(kg.g.tentative)
				for x := range a.specs {
					s, acc := &a.specs[x], &kg.g.accs[x]
					if canonical || s.fn != aggCountDistinct {
						members = a.appendSortedMembers(members[:0], s, acc)
						a.encodeAccMembers(&e, s, acc, members)
					} else {
						a.encodeAccSet(&e, acc)
					}
				}
			}
			if len(e.b) != sizes[i] {
				panic(fmt.Sprintf("operator: window encoded in %d bytes, sized %d", len(e.b), sizes[i]))
			}
			return e.b
		}, emit)
	}}
}

// sortedMembers is a count_distinct accumulator's members, sorted (nil
// for other functions).
func (a *aggregate) sortedMembers(s *aggSpec, acc *accumulator) []string {
	if s.fn != aggCountDistinct {
		return nil
	}
	return a.appendSortedMembers(make([]string, 0, len(acc.distinct)), s, acc)
}

// appendSortedMembers is sortedMembers appended to members (reused).
func (a *aggregate) appendSortedMembers(members []string, s *aggSpec, acc *accumulator) []string {
	if s.fn != aggCountDistinct {
		return members
	}
	for m := range acc.distinct {
		members = append(members, m)
	}
	slices.Sort(members)
	return members
}

// accSize is the exact size of what encodeAccMembers writes.
func (a *aggregate) accSize(s *aggSpec, acc *accumulator) int {
	size := varintSize(acc.count)
	switch s.fn {
	case aggSum, aggAvg:
		if s.kind == tuple.KindFloat {
			size += 8
		} else {
			size += varintSize(acc.sumI)
		}
	case aggMin, aggMax:
		size += valueSize(acc.ext)
	case aggCountDistinct:
		size += uvarintSize(uint64(len(acc.distinct)))
		for m := range acc.distinct {
			size += uvarintSize(uint64(len(m))) + len(m)
		}
	}
	return size
}

type keyedGroup struct {
	key string
	g   *aggGroup
}

// encodeGroup writes one group: key encoding, tentative flag, accumulators.
func (a *aggregate) encodeGroup(e *encoder, key string, g *aggGroup) {
	e.str(key)
	e.bool(g.tentative)
	for i := range a.specs {
		a.encodeAcc(e, &a.specs[i], &g.accs[i])
	}
}

// groupSlab hands out restored groups, their accumulators and key values
// from blocks of slabGroups groups: three allocations per block instead
// of three per group. A block is freed once none of its groups is held
// (the groups of a window close together).
type groupSlab struct {
	gs   []aggGroup
	accs []accumulator
	vals []tuple.Value
	// left is how many groups are still to come (the window's count): a
	// block is never larger, so a small window allocates a small block.
	left int
}

// slabGroups is the size of a groupSlab block: large enough that
// allocation is no longer per group, small enough that a corrupt group
// count (bounded by the snapshot's bytes) cannot make one block huge.
const slabGroups = 4096

func (sl *groupSlab) next(nAccs, nKeys int) *aggGroup {
	if len(sl.gs) == 0 {
		n := min(max(sl.left, 1), slabGroups)
		sl.gs = make([]aggGroup, n)
		sl.accs = make([]accumulator, n*nAccs)
		sl.vals = make([]tuple.Value, n*nKeys)
	}
	sl.left--
	g := &sl.gs[0]
	sl.gs = sl.gs[1:]
	g.accs, sl.accs = sl.accs[:nAccs:nAccs], sl.accs[nAccs:]
	g.keyVals, sl.vals = sl.vals[:0:nKeys], sl.vals[nKeys:]
	return g
}

// decodeGroup reads what encodeGroup wrote, into a group from sl.
func (a *aggregate) decodeGroup(d *decoder, sl *groupSlab) (string, *aggGroup, error) {
	key := d.str()
	g := sl.next(len(a.specs), len(a.groupBy))
	g.tentative = d.bool()
	for i := range a.specs {
		a.decodeAcc(d, &a.specs[i], &g.accs[i])
	}
	if d.err != nil {
		return "", nil, d.err
	}
	var err error
	if g.keyVals, err = decodeKeyInto(g.keyVals, key, len(a.groupBy)); err != nil {
		return "", nil, err
	}
	return key, g, nil
}

func (a *aggregate) encodeAcc(e *encoder, s *aggSpec, acc *accumulator) {
	a.encodeAccMembers(e, s, acc, a.sortedMembers(s, acc))
}

// encodeAccMembers is encodeAcc with a count_distinct accumulator's
// members already sorted.
func (a *aggregate) encodeAccMembers(e *encoder, s *aggSpec, acc *accumulator, members []string) {
	e.varint(acc.count)
	switch s.fn {
	case aggSum, aggAvg:
		if s.kind == tuple.KindFloat {
			e.f64(acc.sumF)
		} else {
			e.varint(acc.sumI)
		}
	case aggMin, aggMax:
		e.value(acc.ext)
	case aggCountDistinct:
		e.uvarint(uint64(len(members)))
		for _, m := range members {
			e.str(m)
		}
	}
}

// encodeAccSet is encodeAccMembers of a count_distinct accumulator with
// its members in the set's order, written straight from the set.
func (a *aggregate) encodeAccSet(e *encoder, acc *accumulator) {
	e.varint(acc.count)
	e.uvarint(uint64(len(acc.distinct)))
	for m := range acc.distinct {
		e.str(m)
	}
}

// Restore replaces all state with the snapshot's.
func (a *aggregate) Restore(state []byte) error {
	d, err := newDecoder(state, a.signature)
	if err != nil {
		return err
	}
	return a.restore(d)
}

// restoreOwned is Restore from a snapshot handed over (RestoreOwned).
func (a *aggregate) restoreOwned(state []byte) error {
	d, err := newOwnedDecoder(state, a.signature)
	if err != nil {
		return err
	}
	return a.restore(d)
}

func (a *aggregate) restore(d *decoder) error {
	watermark := d.varint()
	late := d.uvarint()
	windows := map[int64]*aggWindow{}
	nw := d.count(2)
	for range nw {
		start := d.varint()
		ng := d.count(2)
		w := a.newWindowOf(start, ng) // no growth while restoring
		sl := groupSlab{left: ng}
		var keys []string // the slot index's lists, carved (slotIndex.addFrom)
		if a.keyed {
			keys = make([]string, ng)
		}
		for range ng {
			key, g, err := a.decodeGroup(d, &sl)
			if err != nil {
				return err
			}
			w.groups[key] = g
			if a.keyed {
				w.bySlot.addFrom(queryspec.Slot(g.keyVals), key, &keys)
			}
		}
		windows[w.start] = w
	}
	if err := d.finish(); err != nil {
		return err
	}
	a.watermark, a.late, a.windows, a.lastWin = watermark, late, windows, nil
	return nil
}

func (a *aggregate) decodeAcc(d *decoder, s *aggSpec, acc *accumulator) {
	acc.count = d.varint()
	switch s.fn {
	case aggSum, aggAvg:
		if s.kind == tuple.KindFloat {
			acc.sumF = d.f64()
		} else {
			acc.sumI = d.varint()
			a.sumBound = max(a.sumBound, magnitude(acc.sumI))
		}
	case aggMin, aggMax:
		acc.ext = d.value()
	case aggCountDistinct:
		n := d.count(1)
		if n > 0 {
			// Room to grow: a restored task goes on adding members (a
			// moved copy catching up adds to every open window at once),
			// and a set made for exactly n would soon grow, rehashing
			// every member (BenchmarkProcessAfterRestore: a third more
			// CPU for a moved copy's first 200 ms of input). A quarter
			// more, not a quarter and 8 more: the 8 made every set a
			// table (none fitted Go's small map of 8) and doubled most
			// sets' tables for nothing. A worker that had not held the
			// state before then wrote bench move's 6,259 sets into about
			// 6 MB of untouched memory instead of about 4, and on this
			// project's VM a page fault costs ~16 us: page faults are
			// most of such a restore's CPU (BenchmarkMoveStateCodec/
			// receive-stream, alternated: 2,490 page faults and a
			// median 60 cpu-ms with the 8, 1,840 and 54 without; the
			// first 41 records after it cost the same, 13-21 cpu-ms).
			acc.distinct = make(map[string]struct{}, n+n/4)
		}
		for range n {
			acc.distinct[d.str()] = struct{}{}
		}
	}
}
