package operator

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"
)

// TestSetBuilderRestoresTheSameState: a count_distinct state of many open
// windows (more than the builder's batches, so they go round) restores
// through each path, with its sets built beside the decoding, to the same
// state as with each set built as it is decoded (inlineSets) and as the
// original: equal canonical snapshots, equal output afterwards.
func TestSetBuilderRestoresTheSameState(t *testing.T) {
	def := aggDef("40ns", "1ns", []string{"src"}, "n=count()", "d=count_distinct(port)", "e=count_distinct(src)")
	feed := func(op Operator, from, to int, out Emitter) {
		for i := from; i < to; i++ {
			if err := op.Process(0, conn(int64(i/3), fmt.Sprintf("k%d", i%5), int64(i%17), 0.5, true), out); err != nil {
				t.Fatal(err)
			}
			if i%3 == 2 {
				_ = op.Advance(int64(i/3), out)
			}
		}
	}
	orig := mustNew(t, def, connSchema)
	feed(orig, 0, 300, Collect())
	snap, err := orig.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(orig.(*aggregate).windows); n <= setBuilderBatches {
		t.Fatalf("%d open windows: the batches would not go round", n)
	}
	want := Collect()
	feed(orig, 300, 450, want)
	restores := map[string]func(Operator) error{
		"Restore":      func(op Operator) error { return op.Restore(snap) },
		"RestoreOwned": func(op Operator) error { return RestoreOwned(op, bytes.Clone(snap)) },
		"RestoreStream": func(op Operator) error {
			return RestoreStream(op, bufio.NewReaderSize(bytes.NewReader(snap), 64), len(snap))
		},
	}
	for name, restore := range restores {
		for _, inline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/inline=%v", name, inline), func(t *testing.T) {
				inlineSets, setBatchMembers = inline, 1 // a batch per window
				defer func() { inlineSets, setBatchMembers = false, 4096 }()
				op := mustNew(t, def, connSchema)
				if err := restore(op); err != nil {
					t.Fatal(err)
				}
				if got, _ := op.Snapshot(); !bytes.Equal(got, snap) {
					t.Fatal("the restored state encodes differently from the original")
				}
				got := Collect()
				feed(op, 300, 450, got)
				if g, w := rows(got.Tuples), rows(want.Tuples); fmt.Sprint(g) != fmt.Sprint(w) {
					t.Fatalf("output after the restore differs\n got: %v\nwant: %v", g, w)
				}
			})
		}
	}
}
