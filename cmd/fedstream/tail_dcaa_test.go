package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// tail marks DCAA results: each line's type says TENTATIVE, UNDO or
// REC_DONE, and an UNDO says which result it goes back to.
func TestTailMarksTentativeAndUndo(t *testing.T) {
	var out bytes.Buffer
	print := resultPrinter(&out, true)
	for _, tp := range []tuple.Tuple{
		{Type: tuple.Tentative, ID: 7, Values: []tuple.Value{tuple.Int(3)}},
		{Type: tuple.Undo, ID: 8, STime: 6},
		{Type: tuple.RecDone, ID: 10},
	} {
		if err := print(&tp, nil, "out"); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"TENTATIVE", "UNDO", "REC_DONE"}
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["type"] != want[i] {
			t.Errorf("line %d: type %v, want %s", i, m["type"], want[i])
		}
		if i == 1 && m["undo_to"] != float64(6) {
			t.Errorf("UNDO line %s: want undo_to 6", line)
		}
	}
	out.Reset()
	text := resultPrinter(&out, false)
	if err := text(&tuple.Tuple{Type: tuple.Undo, ID: 8, STime: 6}, nil, "out"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "after #6") {
		t.Errorf("text UNDO line %q does not say where it goes back to", out.String())
	}
}

// tail numbers a sink's results by stable id and resumes by it: a
// replica that corrected its output (tentative results, UNDO, REC_DONE
// took positions on it alone) and one that did not give the same stable
// results with the same ids, and a move from one to the other, before or
// after the correction, neither skips nor repeats a result. Before, tail
// printed positions and resumed by position: a move after a correction
// skipped results (their positions on the other replica were below the
// one it resumed after).
func TestTailResumesByStableID(t *testing.T) {
	st := func(id uint64, v int64) tuple.Tuple {
		return tuple.Tuple{Type: tuple.Stable, ID: id, STime: v, Values: []tuple.Value{tuple.Int(v)}}
	}
	bd := func(id uint64, at int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Boundary, ID: id, STime: at} }
	tent := func(id uint64, v int64) tuple.Tuple {
		return tuple.Tuple{Type: tuple.Tentative, ID: id, STime: v, Values: []tuple.Value{tuple.Int(v)}}
	}
	// Replica 0 corrected its output; replica 1 ran without failure.
	r0 := []tuple.Tuple{st(1, 1), bd(2, 10), tent(3, 11), tent(4, 12), {Type: tuple.Undo, ID: 5, STime: 2},
		st(6, 13), bd(7, 20), {Type: tuple.RecDone, ID: 8}, st(9, 21), bd(10, 30)}
	r0off := []uint64{0, 0, 1, 2, 3, 3, 3, 4, 4, 4} // positions outside the stable view up to each
	r1 := []tuple.Tuple{st(1, 1), bd(2, 10), st(3, 13), bd(4, 20), st(5, 21), bd(6, 30), st(7, 31), bd(8, 40)}
	want := []string{"1:1", "3:13", "5:21", "7:31"} // stable id: value
	feed := func(tl *tailer, ts []tuple.Tuple, off []uint64, after uint64, upTo int) {
		t.Helper()
		var batch []tuple.Tuple
		var o []uint64
		for i, tp := range ts {
			if tp.ID > after && i < upTo {
				batch = append(batch, tp)
				if off != nil {
					o = append(o, off[i])
				} else {
					o = append(o, 0)
				}
			}
		}
		if len(batch) == 0 {
			return
		}
		if err := tl.batch(batch, batch[len(batch)-1].ID, o[len(o)-1], nil, "out"); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		upTo int // replica 0's tuples read before the move
	}{{"after the correction", 8}, {"during the failure", 4}, {"before", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []tuple.Tuple
			tl := &tailer{print: func(tp *tuple.Tuple, _ *tuple.Schema, _ string) error {
				got = append(got, *tp.Clone())
				return nil
			}}
			tl.fresh = true
			feed(tl, r0, r0off, 0, tc.upTo)
			tl.fresh = true // moves to replica 1, resuming after the stable id as a position
			feed(tl, r1, nil, tl.lastID, len(r1))
			var stable []string
			tentative := false
			for _, tp := range got {
				switch tp.Type {
				case tuple.Stable:
					stable = append(stable, fmt.Sprintf("%d:%d", tp.ID, tp.Values[0].I))
				case tuple.Tentative:
					tentative = true
				case tuple.Undo:
					tentative = false
				}
			}
			if !slices.Equal(stable, want) {
				t.Fatalf("stable results %v, want %v (all: %v)", stable, want, got)
			}
			if tentative {
				t.Fatalf("tentative results left shown after the move: %v", got)
			}
		})
	}
}

// tail prints an UNCORRECTABLE record once, marked, with its range, in
// --json as type UNCORRECTABLE with from and to, and with --stable-only
// too (it concerns final results); a second copy of the same range (the
// other replica's, resent after a resumption) is not printed again.
func TestTailPrintsUncorrectable(t *testing.T) {
	const from, to = int64(1_000_000_000), int64(2_000_000_000)
	for _, stable := range []bool{false, true} {
		var out bytes.Buffer
		tl := &tailer{stable: stable, print: resultPrinter(&out, true)}
		mk := func() tuple.Tuple { return tuple.UncorrectableMarker(from, to) }
		st := tuple.Tuple{Type: tuple.Stable, STime: 5, Values: []tuple.Value{tuple.Int(5)}}
		// Positions 1..4: stable, marker, stable, marker again; two
		// positions outside the stable view.
		if err := tl.batch([]tuple.Tuple{st, mk(), st, mk()}, 4, 2, nil, "out"); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 {
			t.Fatalf("stable-only %v: %d lines, want 3 (two results, one record): %q", stable, len(lines), out.String())
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[1]), &m); err != nil {
			t.Fatal(err)
		}
		if m["type"] != "UNCORRECTABLE" || m["from"] != "1970-01-01T00:00:01Z" || m["to"] != "1970-01-01T00:00:02Z" || m["id"] != float64(1) {
			t.Fatalf("stable-only %v: record line %s", stable, lines[1])
		}
	}
	var out bytes.Buffer
	mk := tuple.UncorrectableMarker(from, to)
	if err := resultPrinter(&out, false)(&mk, nil, "out"); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.HasPrefix(s, "UNCORRECTABLE") || !strings.Contains(s, "could not be corrected") || !strings.Contains(s, "1970-01-01T00:00:02Z") {
		t.Fatalf("text line %q does not mark the record with its range", s)
	}
}
