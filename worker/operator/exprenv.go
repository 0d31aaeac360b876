package operator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// exprEnv is the variable environment shared by one operator's compiled
// expressions. Expressions are compiled once against a map[string]any whose
// values carry each field's Go type (int/timestamp -> int64, float ->
// float64, string/bytes -> string, bool -> bool); the expression library
// then reads variables with a single map lookup (its "fast map" path).
//
// Simple expressions run as typed closures over the tuple (fastexpr.go) and
// need no environment. For the others, bind refills only the fields the
// expressions reference, and re-boxes a numeric field only when its value
// changed since the previous tuple. One vm.VM is reused for every run,
// keeping its stack.
type exprEnv struct {
	schema   *tuple.Schema
	template map[string]any // typed zero values, for compiling only
	vars     map[string]any // the environment handed to the VM
	slots    []envSlot      // referenced fields, each once
	needVars bool           // some expression runs on the VM, so bind fills vars
	machine  vm.VM
	// meter charges the predicate runs of VM expressions (compiled in by
	// queryspec.ExprOptions) and carries the task's stop signal.
	meter queryspec.Meter
	// overBudget counts evaluations refused for going over the cost budget.
	overBudget uint64
}

// envSlot is one referenced field and the value last stored in vars.
type envSlot struct {
	name  string
	field int
	kind  tuple.Kind
	set   bool
	last  uint64 // bits of the last stored numeric value (int64 or float64)
}

func newExprEnv(schema *tuple.Schema) *exprEnv {
	env := &exprEnv{
		schema:   schema,
		template: make(map[string]any, schema.Len()),
		vars:     make(map[string]any, schema.Len()),
	}
	// The library's memory budget (ranges, arrays, loop scopes, repeat)
	// is per run, like the meter's.
	env.machine.MemoryBudget = queryspec.ExprCostBudget
	for _, f := range schema.Fields {
		env.template[f.Name] = queryspec.ZeroFor(f.Kind)
	}
	return env
}

// compiledExpr is one compiled expression.
type compiledExpr struct {
	program *vm.Program
	kind    tuple.Kind // static result kind; KindInvalid if not a field kind
	fast    *typedFn   // typed closures (see fastexpr.go); nil: run the VM
}

// compile type-checks and compiles src once. asBool requires a boolean
// result. `now()` is disabled and the time zone fixed to UTC: replicas
// must compute identical results wherever they run.
func (e *exprEnv) compile(src string, asBool bool) (*compiledExpr, error) {
	// The very options the query was type-checked with at submit, so that
	// what validated there compiles here to the same program.
	opts := queryspec.ExprOptions(e.schema, &e.meter)
	if asBool {
		opts = append(opts, expr.AsBool())
	}
	program, err := expr.Compile(src, opts...)
	if err != nil {
		return nil, err
	}
	c := &compiledExpr{program: program}
	c.kind, _ = kindOfType(program.Node().Type())
	if fn, ok := fastCompile(program.Node(), e.schema); ok && fn.kind() == c.kind {
		c.fast = &fn
	} else {
		e.needVars = true
	}
	root := program.Node()
	refs := identCollector{names: map[string]bool{}}
	ast.Walk(&root, &refs)
	for _, f := range e.schema.Fields {
		if refs.names[f.Name] || refs.names["$env"] {
			e.reference(f.Name)
		}
	}
	return c, nil
}

// reference makes bind check (and, for the VM, load) the named field.
func (e *exprEnv) reference(name string) {
	for _, s := range e.slots {
		if s.name == name {
			return
		}
	}
	i := e.schema.Index(name)
	e.slots = append(e.slots, envSlot{name: name, field: i, kind: e.schema.Fields[i].Kind})
	e.vars[name] = queryspec.ZeroFor(e.schema.Fields[i].Kind)
}

type identCollector struct{ names map[string]bool }

func (c *identCollector) Visit(node *ast.Node) {
	if id, ok := (*node).(*ast.IdentifierNode); ok {
		c.names[id.Value] = true
	}
}

// bind checks t's referenced fields against the schema and, when some
// expression runs on the VM, loads them into the environment.
func (e *exprEnv) bind(t *tuple.Tuple) error {
	for i := range e.slots {
		s := &e.slots[i]
		if k := t.Values[s.field].Kind; k != s.kind {
			return fmt.Errorf("%w: field %q is %s, schema says %s", ErrTypeMismatch, s.name, k, s.kind)
		}
	}
	if !e.needVars {
		return nil
	}
	for i := range e.slots {
		s := &e.slots[i]
		v := &t.Values[s.field]
		switch s.kind {
		case tuple.KindInt, tuple.KindTimestamp:
			if !s.set || s.last != uint64(v.I) {
				e.vars[s.name] = v.I
				s.last, s.set = uint64(v.I), true
			}
		case tuple.KindFloat:
			if bits := math.Float64bits(v.F); !s.set || s.last != bits {
				e.vars[s.name] = v.F
				s.last, s.set = bits, true
			}
		case tuple.KindBool:
			if !s.set || s.last != uint64(v.I) {
				e.vars[s.name] = v.I != 0 // boxing a bool does not allocate
				s.last, s.set = uint64(v.I), true
			}
		default:
			// Strings may alias the caller's reused buffer, so they are
			// re-stored every time rather than compared with the last one.
			e.vars[s.name] = v.S
		}
	}
	return nil
}

// evalBool evaluates a boolean expression against the bound tuple t.
func (e *exprEnv) evalBool(c *compiledExpr, t *tuple.Tuple) (bool, error) {
	if c.fast != nil {
		return c.fast.b(t.Values), nil
	}
	res, err := e.run(c)
	if err != nil {
		return false, err
	}
	b, ok := res.(bool)
	if !ok {
		return false, fmt.Errorf("%w: yielded %T, not bool", ErrEval, res)
	}
	return b, nil
}

// evalValue evaluates an expression of static kind c.kind against the
// bound tuple t.
func (e *exprEnv) evalValue(c *compiledExpr, t *tuple.Tuple) (tuple.Value, error) {
	if c.fast != nil {
		return c.fast.eval(t.Values), nil
	}
	res, err := e.run(c)
	if err != nil {
		return tuple.Value{}, err
	}
	return toValue(res, c.kind)
}

// run evaluates c on the VM within the cost budget. An evaluation the
// task's stop signal aborted returns an error wrapping context.Canceled
// (not ErrEval: the task is stopping, nothing is dropped); one over the
// budget wraps ErrEval and queryspec.ErrCostBudget and is counted.
func (e *exprEnv) run(c *compiledExpr) (any, error) {
	e.meter.Reset()
	res, err := e.machine.Run(c.program, e.vars)
	if err == nil {
		return res, nil
	}
	if errors.Is(err, context.Canceled) {
		return nil, err
	}
	if errors.Is(err, queryspec.ErrCostBudget) {
		e.overBudget++
		return nil, &budgetError{msg: firstLine(err.Error())}
	}
	if strings.Contains(err.Error(), "memory budget exceeded") {
		// The library's own budget (ranges, arrays, repeat), set to the
		// same number of units.
		e.overBudget++
		return nil, &budgetError{msg: fmt.Sprintf("%v: %s", queryspec.ErrCostBudget, firstLine(err.Error()))}
	}
	return nil, fmt.Errorf("%w: %w", ErrEval, err)
}

// budgetError is the evaluation error of a tuple over the cost budget.
type budgetError struct{ msg string }

func (e *budgetError) Error() string   { return ErrEval.Error() + ": " + e.msg }
func (e *budgetError) Unwrap() []error { return []error{ErrEval, queryspec.ErrCostBudget} }

// firstLine is the message of a library error without its source snippet.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// setDone makes a running evaluation stop when done is closed.
func (e *exprEnv) setDone(done <-chan struct{}) { e.meter.Done = done }

// kindOfType maps an expression's static result type to a field kind.
func kindOfType(t reflect.Type) (tuple.Kind, bool) {
	if t == nil {
		return tuple.KindInvalid, false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return tuple.KindInt, true
	case reflect.Float32, reflect.Float64:
		return tuple.KindFloat, true
	case reflect.String:
		return tuple.KindString, true
	case reflect.Bool:
		return tuple.KindBool, true
	}
	return tuple.KindInvalid, false
}

// toValue converts an expression result to a value of the expected kind.
func toValue(res any, kind tuple.Kind) (tuple.Value, error) {
	switch x := res.(type) {
	case int:
		if kind == tuple.KindInt {
			return tuple.Int(int64(x)), nil
		}
	case int64:
		if kind == tuple.KindInt {
			return tuple.Int(x), nil
		}
	case float64:
		if kind == tuple.KindFloat {
			return tuple.Float(x), nil
		}
	case string:
		if kind == tuple.KindString {
			return tuple.Str(x), nil
		}
	case bool:
		if kind == tuple.KindBool {
			return tuple.Bool(x), nil
		}
	case int8, int16, int32, uint, uint8, uint16, uint32, uint64, float32:
		rv := reflect.ValueOf(x)
		switch {
		case kind == tuple.KindInt && rv.CanInt():
			return tuple.Int(rv.Int()), nil
		case kind == tuple.KindInt && rv.CanUint():
			return tuple.Int(int64(rv.Uint())), nil
		case kind == tuple.KindFloat && rv.CanFloat():
			return tuple.Float(rv.Float()), nil
		}
	}
	return tuple.Value{}, fmt.Errorf("%w: result %v (%T) is not %s", ErrEval, res, res, kind)
}
