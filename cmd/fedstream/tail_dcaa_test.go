package main

import (
	"bytes"
	"encoding/json"
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
