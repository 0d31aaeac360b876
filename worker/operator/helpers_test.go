package operator

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// connSchema is the test input: the network-monitoring connection stream.
var connSchema = tuple.NewSchema([]tuple.Field{
	{Name: "time", Kind: tuple.KindTimestamp},
	{Name: "src", Kind: tuple.KindString},
	{Name: "port", Kind: tuple.KindInt},
	{Name: "load", Kind: tuple.KindFloat},
	{Name: "ok", Kind: tuple.KindBool},
})

// conn builds a stable connSchema tuple at stime.
func conn(stime int64, src string, port int64, load float64, ok bool) *tuple.Tuple {
	return &tuple.Tuple{
		Type:  tuple.Stable,
		STime: stime,
		Values: []tuple.Value{
			tuple.Timestamp(stime), tuple.Str(src), tuple.Int(port), tuple.Float(load), tuple.Bool(ok),
		},
	}
}

func tentative(t *tuple.Tuple) *tuple.Tuple {
	t.Type = tuple.Tentative
	return t
}

// event is one call on an operator: Process(port, tup) or, when tup is nil,
// Advance(watermark).
type event struct {
	port      int
	tup       *tuple.Tuple
	watermark int64
}

func in(port int, t *tuple.Tuple) event { return event{port: port, tup: t} }
func adv(wm int64) event                { return event{watermark: wm} }

// run feeds events to op and returns what it emitted.
func run(t *testing.T, op Operator, events []event) []tuple.Tuple {
	t.Helper()
	c := Collect()
	for i, ev := range events {
		var err error
		if ev.tup != nil {
			err = op.Process(ev.port, ev.tup, c)
		} else {
			err = op.Advance(ev.watermark, c)
		}
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	return c.Tuples
}

func mustNew(t *testing.T, def *queryspec.Operator, inputs ...*tuple.Schema) Operator {
	t.Helper()
	op, err := New(def, inputs)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return op
}

// row renders a tuple compactly for comparisons: "TYPE@stime[v1 v2 ...]".
func row(t tuple.Tuple) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s@%d[", t.Type, t.STime)
	for i, v := range t.Values {
		if i > 0 {
			b.WriteByte(' ')
		}
		switch v.Kind {
		case tuple.KindFloat:
			fmt.Fprintf(&b, "%g", v.F)
		case tuple.KindString, tuple.KindBytes:
			fmt.Fprintf(&b, "%q", v.S)
		case tuple.KindBool:
			fmt.Fprintf(&b, "%t", v.I != 0)
		case tuple.KindTimestamp:
			fmt.Fprintf(&b, "t%d", v.I)
		default:
			fmt.Fprintf(&b, "%d", v.I)
		}
	}
	b.WriteByte(']')
	return b.String()
}

func rows(ts []tuple.Tuple) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = row(t)
	}
	return out
}

func equalRows(t *testing.T, got []tuple.Tuple, want []string) {
	t.Helper()
	g := rows(got)
	if strings.Join(g, "\n") != strings.Join(want, "\n") {
		t.Errorf("output mismatch\n got: %s\nwant: %s", strings.Join(g, "\n      "), strings.Join(want, "\n      "))
	}
}

func schemaString(s *tuple.Schema) string { return schemaSignature(s) }

// unsafeString aliases b, as a decoder that avoids copies would.
func unsafeString(b []byte) string { return unsafe.String(&b[0], len(b)) }
