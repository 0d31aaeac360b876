package operator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// A predicate whose work per tuple is unbounded (here a string doubled on
// every step of a reduce) is stopped at the cost budget: the tuple is
// dropped with an error wrapping ErrEval and ErrCostBudget, counted, and
// the next tuple is evaluated normally.
func TestExpressionCostBudget(t *testing.T) {
	cases := []struct{ name, where string }{
		{"growing value", `len(reduce(1..25, #acc + #acc, src)) > 0`},
		{"too many predicate runs", `sum(map(1..port, {sum(map(1..port, {# * 2}))})) < 0`},
		{"library memory budget", `len(map(split(repeat(src, 300000), ""), #)) > 0`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: tc.where + ` || port == 7`}, connSchema)
			c := Collect()
			start := time.Now()
			err := op.Process(0, conn(1, "ab", 1000, 0, true), c)
			if !errors.Is(err, ErrEval) || !errors.Is(err, queryspec.ErrCostBudget) {
				t.Fatalf("Process = %v, want an error wrapping ErrEval and ErrCostBudget", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("evaluation took %v before it was refused", d)
			}
			if n := OverBudgetTuples(op); n != 1 {
				t.Errorf("OverBudgetTuples = %d, want 1", n)
			}
			if len(c.Tuples) != 0 {
				t.Errorf("an over-budget tuple was emitted")
			}
		})
	}
}

// A predicate whose every run is slow, within the unit budget, is stopped
// by the wall-clock limit instead of running for seconds.
func TestExpressionTimeLimit(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: `all(1..90000, {upper(src) != "Z"})`}, connSchema)
	big := strings.Repeat("a", 200<<10)
	start := time.Now()
	err := op.Process(0, conn(1, big, 1, 0, true), Collect())
	if !errors.Is(err, queryspec.ErrCostBudget) {
		t.Fatalf("Process = %v, want ErrCostBudget", err)
	}
	if !strings.Contains(err.Error(), "longer than") {
		t.Errorf("Process = %v, want the time limit", err)
	}
	if d := time.Since(start); d > queryspec.ExprTimeLimit+3*time.Second {
		t.Errorf("evaluation took %v; the limit is %v", d, queryspec.ExprTimeLimit)
	}
}

// StopOn aborts an evaluation in progress: the goroutine evaluating a slow
// predicate returns promptly once the stop signal closes, with an error
// that is not ErrEval (nothing is dropped: the task is stopping).
func TestStopOnAbortsEvaluation(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: `all(1..90000, {upper(src) != "Z"})`}, connSchema)
	ctx, cancel := context.WithCancel(context.Background())
	StopOn(op, ctx.Done())
	big := strings.Repeat("a", 200<<10)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		done <- op.Process(0, conn(1, big, 1, 0, true), Collect())
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrEval) {
			t.Fatalf("Process = %v, want context.Canceled and not ErrEval", err)
		}
	case <-time.After(queryspec.ExprTimeLimit / 2):
		t.Fatal("evaluation went on after the stop signal")
	}
}

// The fast path (typed closures) is untouched: a simple predicate never
// reaches the meter.
func TestFastPathUnmetered(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: `port > 5`}, connSchema)
	if op.(*filter).where.fast == nil {
		t.Fatal("simple predicate no longer takes the fast path")
	}
	_ = tuple.Int
}

// An error of an operator further down a chain reaches the chain's caller
// (it used to be overwritten by the nil its upstream operator returned, so
// a tuple dropped for a failed expression, or an evaluation aborted by a
// stop, went unnoticed).
func TestChainKeepsDownstreamError(t *testing.T) {
	m1 := mustNew(t, &queryspec.Operator{Name: "m1", Type: "map", Fields: queryspec.Exprs{{Name: "port", Expr: "port + 0"}, {Name: "src", Expr: "src"}}}, connSchema)
	m2 := mustNew(t, &queryspec.Operator{Name: "m2", Type: "map", Fields: queryspec.Exprs{{Name: "port", Expr: "port + 1 - 1"}}}, m1.OutputSchema())
	f := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: "10 % port == 0"}, m2.OutputSchema())
	ch := Chain(m1, m2, f)
	err := ch.Process(0, conn(1, "a", 0, 0, true), Collect())
	if !errors.Is(err, ErrEval) {
		t.Fatalf("chain Process = %v, want the filter's ErrEval", err)
	}
}
