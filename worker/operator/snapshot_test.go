package operator

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// snapshotCase is an operator definition with the input schemas and a
// generator of random tuples for a port.
type snapshotCase struct {
	name   string
	def    *queryspec.Operator
	inputs []*tuple.Schema
}

func snapshotCases() []snapshotCase {
	one := []*tuple.Schema{connSchema}
	return []snapshotCase{
		{"filter", &queryspec.Operator{Name: "f", Type: "filter", Where: `port > 3 && src != "c"`}, one},
		{"map", &queryspec.Operator{Name: "m", Type: "map", Fields: queryspec.Exprs{{Name: "p", Expr: "port * 2"}, {Name: "s", Expr: "src"}}}, one},
		{"split", &queryspec.Operator{Name: "s", Type: "split", Field: "src", Lower: true}, one},
		{"union", &queryspec.Operator{Name: "u", Type: "union"}, []*tuple.Schema{connSchema, connSchema, connSchema}},
		{"tumbling aggregate", aggDef("10ns", "", []string{"src"},
			"n=count()", "s=sum(port)", "a=avg(load)", "lo=min(src)", "hi=max(port)", "d=count_distinct(port)"), one},
		{"sliding aggregate", aggDef("12ns", "4ns", []string{"ok", "src"},
			"n=count()", "s=sum(load)", "a=avg(port)", "lo=min(load)", "hi=max(src)", "d=count_distinct(src)"), one},
		{"global aggregate", aggDef("7ns", "", nil, "n=count()", "d=count_distinct(load)"), one},
		{"join", joinDef("10ns", "src"), []*tuple.Schema{busySchema, probeSchema}},
	}
}

// randomStream builds a random event stream: non-decreasing stimes, some
// tentative tuples, watermarks (sometimes going back, which is ignored),
// some late tuples, and a final watermark that closes every window.
func randomStream(r *rand.Rand, inputs []*tuple.Schema, n int) []event {
	srcs := []string{"a", "b", "c", "dd", "a\x00b", " Dd  e\tA "}
	var events []event
	var now, wm int64
	for range n {
		switch p := r.IntN(100); {
		case p < 10:
			wm = now - r.Int64N(4)
			events = append(events, adv(wm))
			continue
		case p < 13 && wm > 0:
			// late: below the last watermark
		default:
			now += r.Int64N(4)
		}
		stime := now
		if wm > 0 && r.IntN(100) < 13 {
			stime = wm - 1 - r.Int64N(3)
		}
		port := r.IntN(len(inputs))
		vals := make([]tuple.Value, 0, inputs[port].Len())
		for _, f := range inputs[port].Fields {
			switch f.Kind {
			case tuple.KindTimestamp:
				vals = append(vals, tuple.Timestamp(stime))
			case tuple.KindString:
				vals = append(vals, tuple.Str(srcs[r.IntN(len(srcs))]))
			case tuple.KindInt:
				vals = append(vals, tuple.Int(r.Int64N(8)-2))
			case tuple.KindFloat:
				vals = append(vals, tuple.Float(float64(r.IntN(16))/4))
			case tuple.KindBool:
				vals = append(vals, tuple.Bool(r.IntN(2) == 0))
			}
		}
		typ := tuple.Stable
		if r.IntN(10) == 0 {
			typ = tuple.Tentative
		}
		events = append(events, in(port, &tuple.Tuple{Type: typ, STime: stime, Values: vals}))
	}
	return append(events, adv(now+100))
}

// feeder passes events to an operator the way a task would: through one
// reused tuple whose strings alias one reused byte buffer, overwritten
// after every call, so an operator that keeps uncopied data fails the test.
type feeder struct {
	tup tuple.Tuple
	buf []byte
}

func (f *feeder) feed(t *testing.T, op Operator, events []event, out Emitter) {
	t.Helper()
	for i, ev := range events {
		if ev.tup == nil {
			if err := op.Advance(ev.watermark, out); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			continue
		}
		f.buf = f.buf[:0]
		for _, v := range ev.tup.Values {
			f.buf = append(f.buf, v.S...)
		}
		f.tup = tuple.Tuple{Type: ev.tup.Type, STime: ev.tup.STime, Values: f.tup.Values[:0]}
		off := 0
		for _, v := range ev.tup.Values {
			if v.S != "" {
				v.S = unsafe.String(&f.buf[off], len(v.S))
				off += len(v.S)
			}
			f.tup.Values = append(f.tup.Values, v)
		}
		if err := op.Process(ev.port, &f.tup, out); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		for j := range f.buf {
			f.buf[j] = '#'
		}
		for j := range f.tup.Values {
			f.tup.Values[j] = tuple.Value{Kind: tuple.KindInt, I: -999}
		}
	}
}

func lateOf(op Operator) uint64 {
	if lc, ok := op.(LateCounter); ok {
		return lc.LateTuples()
	}
	return 0
}

// TestSnapshotRestoreMidStream: for random streams, snapshotting at any
// position, restoring into a fresh instance and feeding the rest gives
// exactly the output of the uninterrupted run, and equal state encodes to
// equal bytes.
func TestSnapshotRestoreMidStream(t *testing.T) {
	for _, sc := range snapshotCases() {
		t.Run(sc.name, func(t *testing.T) {
			for seed := range uint64(4) {
				r := rand.New(rand.NewPCG(seed, 42))
				events := randomStream(r, sc.inputs, 300)

				whole := mustNew(t, sc.def, sc.inputs...)
				full := Collect()
				var f feeder
				f.feed(t, whole, events, full)
				if len(full.Tuples) == 0 && sc.def.Type != "filter" {
					t.Fatalf("seed %d: the stream produced no output; the test would prove nothing", seed)
				}

				for cut := 0; cut <= len(events); cut += 7 {
					first := mustNew(t, sc.def, sc.inputs...)
					got := Collect()
					f.feed(t, first, events[:cut], got)
					snap, err := first.Snapshot()
					if err != nil {
						t.Fatal(err)
					}
					if again, _ := first.Snapshot(); !bytes.Equal(snap, again) {
						t.Fatalf("seed %d cut %d: two snapshots of one state differ", seed, cut)
					}
					second := mustNew(t, sc.def, sc.inputs...)
					if err := second.Restore(snap); err != nil {
						t.Fatalf("seed %d cut %d: restore: %v", seed, cut, err)
					}
					if resnap, _ := second.Snapshot(); !bytes.Equal(snap, resnap) {
						t.Fatalf("seed %d cut %d: restored state encodes differently", seed, cut)
					}
					f.feed(t, second, events[cut:], got)
					if g, w := rows(got.Tuples), rows(full.Tuples); !slices.Equal(g, w) {
						t.Fatalf("seed %d cut %d: output differs from the uninterrupted run\n got: %s\nwant: %s",
							seed, cut, strings.Join(g, " "), strings.Join(w, " "))
					}
					if lateOf(second) != lateOf(whole) {
						t.Fatalf("seed %d cut %d: late = %d, want %d", seed, cut, lateOf(second), lateOf(whole))
					}
				}
			}
		})
	}
}

// TestRestoreRejectsBadSnapshots: truncated, corrupted and foreign
// snapshots return ErrBadSnapshot (or, for corruption that still decodes,
// succeed) and never panic.
func TestRestoreRejectsBadSnapshots(t *testing.T) {
	cases := snapshotCases()
	for i, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			events := randomStream(r, sc.inputs, 120)
			op := mustNew(t, sc.def, sc.inputs...)
			var f feeder
			f.feed(t, op, events[:len(events)-1], Collect()) // keep windows open
			snap, err := op.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			for n := range len(snap) {
				if err := mustNew(t, sc.def, sc.inputs...).Restore(snap[:n]); !errors.Is(err, ErrBadSnapshot) {
					t.Fatalf("restore of %d/%d bytes: err = %v, want ErrBadSnapshot", n, len(snap), err)
				}
			}
			if err := mustNew(t, sc.def, sc.inputs...).Restore(append(slices.Clone(snap), 0)); !errors.Is(err, ErrBadSnapshot) {
				t.Errorf("trailing byte: err = %v, want ErrBadSnapshot", err)
			}
			for range 300 {
				bad := slices.Clone(snap)
				bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
				if err := mustNew(t, sc.def, sc.inputs...).Restore(bad); err != nil && !errors.Is(err, ErrBadSnapshot) {
					t.Fatalf("corrupt snapshot: err = %v, want ErrBadSnapshot or nil", err)
				}
			}
			foreign := cases[(i+1)%len(cases)]
			if err := mustNew(t, foreign.def, foreign.inputs...).Restore(snap); !errors.Is(err, ErrBadSnapshot) {
				t.Errorf("restore into %s: err = %v, want ErrBadSnapshot", foreign.name, err)
			}
		})
	}
}
