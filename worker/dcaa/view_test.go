package dcaa

import (
	"errors"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// A stream with a tentative stretch, its UNDO back to the last stable
// position, corrections and REC_DONE: the stable view is the stable
// tuples and boundaries in order, the corrections included.
func TestStableViewAppliesUndo(t *testing.T) {
	stream := []tuple.Tuple{
		{ID: 1, Type: tuple.Stable},
		{ID: 2, Type: tuple.Boundary},
		{ID: 3, Type: tuple.Tentative},
		{ID: 4, Type: tuple.Tentative},
		{ID: 5, Type: tuple.Undo, STime: 2},
		{ID: 6, Type: tuple.Stable},
		{ID: 7, Type: tuple.Boundary},
		{ID: 8, Type: tuple.RecDone},
		{ID: 9, Type: tuple.Stable},
	}
	var v StableView
	for i := range stream {
		if err := v.Add(&stream[i]); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := v.Stable(), []int{0, 1, 5, 6, 8}; !slices.Equal(got, want) {
		t.Fatalf("stable view %v, want %v", got, want)
	}
	if v.Tentative != 2 || v.Undos != 1 || v.RecDones != 1 {
		t.Fatalf("counted %d tentative, %d UNDO, %d REC_DONE", v.Tentative, v.Undos, v.RecDones)
	}
	for _, typ := range []tuple.Type{tuple.Tentative, tuple.Undo, tuple.RecDone} {
		if InStableView(typ) {
			t.Errorf("%v is in the stable view", typ)
		}
	}
}

// An UNDO going back before a stable tuple breaks the protocol: the view
// says so instead of silently dropping it.
func TestStableViewRefusesRetractingStable(t *testing.T) {
	var v StableView
	for _, tp := range []tuple.Tuple{{ID: 1, Type: tuple.Stable}, {ID: 2, Type: tuple.Stable}, {ID: 3, Type: tuple.Tentative}} {
		if err := v.Add(&tp); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.Add(&tuple.Tuple{ID: 4, Type: tuple.Undo, STime: 1}); !errors.Is(err, ErrStableRetracted) {
		t.Fatalf("UNDO back before a stable tuple: %v, want ErrStableRetracted", err)
	}
	if got := v.Stable(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("stable view after the refused UNDO: %v", got)
	}
}
