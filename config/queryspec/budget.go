package queryspec

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
)

// Expression cost budget.
//
// An expression is evaluated once per tuple, on the task's goroutine, so an
// expression that is slow for one tuple holds back the whole stream, and one
// that never ends would keep its worker busy after `query stop`. Expressions
// without loops do work proportional to their size (at most exprMaxNodes
// nodes) and to the tuple's values, so they are bounded already. The
// unbounded work comes from the predicate builtins (all, any, none, one,
// filter, map, count, sum, find..., reduce, sortBy, groupBy), which run
// their predicate once per element, and from values that grow inside them
// (reduce(1..40, #acc + #acc, "x") doubles a string 40 times).
//
// Every predicate body is therefore compiled as a call to a meter
// (costFunc) that charges one unit per run plus the length of the value the
// body produced (string bytes, array or map elements), and checks the
// task's stop signal. A tuple whose evaluation goes over ExprCostBudget
// units is dropped and counted by the operator. The library's own memory
// budget (vm.VM.MemoryBudget, which counts ranges, arrays, loop scopes and
// repeat()) is set to the same number. Both counts depend only on the
// expression and the tuple, so every replica drops the same tuples.
//
// A wall-clock limit (ExprTimeLimit) backs the count up for a predicate
// whose every run is slow (a long string processed per element): it is the
// only part that can differ between replicas, and is logged as such.
// Ranges whose size is known at compile time are checked statically:
// `all(1..100000000, ...)` is refused when the query is submitted.

// ExprCostBudget is the number of cost units one evaluation of one
// expression may use (see the comment above): about a hundred thousand
// predicate runs, well over what a stream predicate needs and a few
// milliseconds of work.
const ExprCostBudget = 100_000

// ExprTimeLimit bounds the wall time of one evaluation that runs
// predicates.
const ExprTimeLimit = time.Second

// exprMaxNodes bounds the syntax tree of one expression, which bounds the
// work of an expression without loops. It is the library's default, set
// here so that it is a documented part of the query format: long literal
// lists (`src in [...]`, compiled to one lookup) stay possible.
const exprMaxNodes = 10_000

// costFuncName is the meter function predicate bodies of no simple type
// are wrapped in, and the prefix of the others (see costFuncs).
const costFuncName = "__fs_cost"

// ErrCostBudget is wrapped by the evaluation error of a tuple whose
// expression used more than its cost budget (or ExprTimeLimit).
var ErrCostBudget = errors.New("expression over its per-tuple cost budget")

// Meter counts the cost of one evaluation. An operator owns one per
// expression environment, calls Reset before each evaluation and sets Done
// to the task's stop signal. The zero value works (budget ExprCostBudget,
// never stopped). Not safe for concurrent use: one task's goroutine
// evaluates.
type Meter struct {
	// Budget is the units an evaluation may use; 0 means ExprCostBudget.
	Budget uint64
	// TimeLimit bounds one evaluation's wall time; 0 means ExprTimeLimit.
	TimeLimit time.Duration
	// Done, when closed, aborts the running evaluation with an error
	// wrapping context.Canceled.
	Done <-chan struct{}

	used    uint64
	started time.Time // set at the first charge of an evaluation
}

// Reset starts a new evaluation.
func (m *Meter) Reset() {
	m.used = 0
	m.started = time.Time{}
}

// Used is the units charged since Reset.
func (m *Meter) Used() uint64 { return m.used }

// checkEvery is how many units pass between wall-clock checks.
const checkEvery = 256

func (m *Meter) charge(units uint64) error {
	if m.Done != nil {
		select {
		case <-m.Done:
			return fmt.Errorf("expression evaluation stopped: %w", context.Canceled)
		default:
		}
	}
	budget := m.Budget
	if budget == 0 {
		budget = ExprCostBudget
	}
	before := m.used
	m.used += units
	if m.used > budget {
		return fmt.Errorf("%w: used more than %d units (a unit is one predicate run or one element or byte it produces)", ErrCostBudget, budget)
	}
	if m.started.IsZero() {
		m.started = time.Now()
	} else if before/checkEvery != m.used/checkEvery {
		limit := m.TimeLimit
		if limit <= 0 {
			limit = ExprTimeLimit
		}
		if time.Since(m.started) > limit {
			return fmt.Errorf("%w: ran longer than %s", ErrCostBudget, limit)
		}
	}
	return nil
}

// costFunc is the meter function: it charges one unit plus the size of
// the value the predicate body produced, and returns the value unchanged.
func (m *Meter) costFunc(args ...any) (any, error) {
	v := args[0]
	units := uint64(1)
	switch x := v.(type) {
	case bool, int, int64, float64, nil:
	case string:
		units += uint64(len(x))
	case []any:
		units += uint64(len(x))
	case map[string]any:
		units += uint64(len(x))
	default:
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.String, reflect.Slice, reflect.Array, reflect.Map:
			units += uint64(rv.Len())
		}
	}
	return v, m.charge(units)
}

// costFuncs are the meter functions, one per static type of predicate
// body: each returns its argument with the argument's type, so wrapping a
// body changes no static type. (One overloaded function would not do: the
// library picks the first overload that accepts an argument of unknown
// type.) Their names cannot clash with a field: field names may not start
// with "__fs".
var costFuncs = []struct {
	name string
	typ  reflect.Type
	sig  any
}{
	{"__fs_cost_bool", reflect.TypeOf(false), new(func(bool) bool)},
	{"__fs_cost_int", reflect.TypeOf(0), new(func(int) int)},
	{"__fs_cost_int64", reflect.TypeOf(int64(0)), new(func(int64) int64)},
	{"__fs_cost_float", reflect.TypeOf(0.0), new(func(float64) float64)},
	{"__fs_cost_string", reflect.TypeOf(""), new(func(string) string)},
	{costFuncName, nil, new(func(any) any)}, // any other or unknown type
}

// costPatcher wraps every predicate body in a call to the meter function
// of its type. The library type-checks the tree before running a patcher,
// so bodies carry their types.
type costPatcher struct{}

func (costPatcher) Visit(node *ast.Node) {
	p, ok := (*node).(*ast.PredicateNode)
	if !ok {
		return
	}
	if call, ok := p.Node.(*ast.CallNode); ok {
		if id, ok := call.Callee.(*ast.IdentifierNode); ok && strings.HasPrefix(id.Value, costFuncName) {
			return // already wrapped (the library may run patchers twice)
		}
	}
	body := p.Node
	name := costFuncName
	if t := body.Type(); t != nil {
		for _, f := range costFuncs {
			if f.typ == t {
				name = f.name
				break
			}
		}
	}
	call := &ast.CallNode{Callee: &ast.IdentifierNode{Value: name}, Arguments: []ast.Node{body}}
	call.SetLocation(body.Location())
	p.Node = call
}

// meteredOptions are the options that install m as the expression's meter.
func meteredOptions(m *Meter) []expr.Option {
	if m == nil {
		m = &Meter{} // compile only (validation): never runs
	}
	opts := []expr.Option{expr.MaxNodes(exprMaxNodes)}
	for _, f := range costFuncs {
		opts = append(opts, expr.Function(f.name, m.costFunc, f.sig))
	}
	return append(opts, expr.Patch(costPatcher{}))
}

// loopBuiltins are the builtins that run a predicate once per element of
// their first argument.
var loopBuiltins = map[string]bool{
	"all": true, "none": true, "any": true, "one": true, "filter": true, "map": true,
	"count": true, "sum": true, "find": true, "findIndex": true, "findLast": true,
	"findLastIndex": true, "groupBy": true, "sortBy": true, "reduce": true,
}

// staticCost estimates the units an expression needs when the sizes of the
// collections its loops run over are known at compile time (integer
// ranges), and reports whether it found one that is over budget: such an
// expression could never evaluate and is refused before it runs. Unknown
// sizes count as zero, so the estimate is a lower bound.
func staticCost(node ast.Node) uint64 {
	var cost uint64
	switch n := node.(type) {
	case *ast.BinaryNode:
		if n.Operator == ".." {
			if size, ok := rangeSize(n); ok {
				return size
			}
		}
		if r, ok := n.Right.(*ast.BinaryNode); ok && (n.Operator == "in" || n.Operator == "not in") && r.Operator == ".." {
			return staticCost(n.Left) // compiled to two comparisons
		}
		cost = satAdd(staticCost(n.Left), staticCost(n.Right))
	case *ast.BuiltinNode:
		if loopBuiltins[n.Name] && len(n.Arguments) >= 2 {
			// The meter and the library's memory budget count separately
			// (predicate runs; the range's elements): a loop over a
			// literal range costs its runs, at least the range's size.
			size, literal := uint64(0), false
			if r, ok := n.Arguments[0].(*ast.BinaryNode); ok && r.Operator == ".." {
				size, literal = rangeSize(r)
			}
			if !literal {
				cost = staticCost(n.Arguments[0])
			}
			if p, ok := n.Arguments[1].(*ast.PredicateNode); ok {
				per := satAdd(1, staticCost(p.Node))
				cost = satAdd(cost, satMul(size, per))
			}
			for _, a := range n.Arguments[2:] {
				cost = satAdd(cost, staticCost(a))
			}
			return cost
		}
		for _, a := range n.Arguments {
			cost = satAdd(cost, staticCost(a))
		}
	case *ast.CallNode:
		for _, a := range n.Arguments {
			cost = satAdd(cost, staticCost(a))
		}
	case *ast.UnaryNode:
		cost = staticCost(n.Node)
	case *ast.ConditionalNode:
		cost = satAdd(staticCost(n.Cond), max(staticCost(n.Exp1), staticCost(n.Exp2)))
	case *ast.PredicateNode:
		cost = staticCost(n.Node)
	case *ast.ChainNode:
		cost = staticCost(n.Node)
	case *ast.MemberNode:
		cost = satAdd(staticCost(n.Node), staticCost(n.Property))
	case *ast.VariableDeclaratorNode:
		cost = satAdd(staticCost(n.Value), staticCost(n.Expr))
	case *ast.SequenceNode:
		for _, e := range n.Nodes {
			cost = satAdd(cost, staticCost(e))
		}
	case *ast.ArrayNode:
		for _, e := range n.Nodes {
			cost = satAdd(cost, staticCost(e))
		}
	}
	return cost
}

func rangeSize(n *ast.BinaryNode) (uint64, bool) {
	lo, ok1 := n.Left.(*ast.IntegerNode)
	hi, ok2 := n.Right.(*ast.IntegerNode)
	if !ok1 || !ok2 {
		return 0, false
	}
	if hi.Value < lo.Value {
		return 0, true
	}
	return uint64(hi.Value-lo.Value) + 1, true
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

func satMul(a, b uint64) uint64 {
	if a != 0 && b > ^uint64(0)/a {
		return ^uint64(0)
	}
	return a * b
}

// checkStaticCost refuses an expression that needs more than the budget
// whatever the tuple.
func checkStaticCost(source string) error {
	tree, err := parser.Parse(source)
	if err != nil {
		return nil // the compiler reports syntax errors
	}
	if c := staticCost(tree.Node); c > ExprCostBudget {
		return exprErrorf("expression needs at least %d cost units per tuple (a unit is one run of a predicate such as all(...) or map(...), or one element it produces); the limit is %d: use smaller ranges", c, ExprCostBudget)
	}
	return nil
}
