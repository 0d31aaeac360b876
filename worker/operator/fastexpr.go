package operator

import (
	"reflect"

	"github.com/expr-lang/expr/ast"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Fast path for simple expressions.
//
// The expression library parses and type-checks every expression (so users
// get its error messages) and its VM can evaluate anything. Running the VM
// costs a map store per changed field, a map lookup per field use, and a
// box per intermediate value. Most stream predicates and projections are
// far simpler: fields, literals, comparisons, boolean logic and + - * /.
// For those, fastCompile turns the checked (and constant-folded) syntax
// tree into typed Go closures that read tuple values directly, with no map
// and no allocation (string concatenation aside).
//
// The subset mirrors the library's semantics: int arithmetic wraps as Go
// int64 does; "/" is always float division (int operands are converted);
// a comparison or arithmetic between int and float is done in float; && and
// || short-circuit. Anything else — "%" (division by zero is a run-time
// error), "**", "in", ranges, calls, members, variables, mixed-class
// equality — makes fastCompile decline, and the VM is used. A differential
// test checks fast path and VM agree.

type valueClass uint8

const (
	classNone valueClass = iota
	classInt
	classFloat
	classString
	classBool
)

// typedFn is a compiled (sub)expression; exactly the closure of its class
// is set.
type typedFn struct {
	class valueClass
	i     func([]tuple.Value) int64
	f     func([]tuple.Value) float64
	s     func([]tuple.Value) string
	b     func([]tuple.Value) bool
}

func (fn typedFn) kind() tuple.Kind {
	switch fn.class {
	case classInt:
		return tuple.KindInt
	case classFloat:
		return tuple.KindFloat
	case classString:
		return tuple.KindString
	case classBool:
		return tuple.KindBool
	}
	return tuple.KindInvalid
}

// eval computes the expression's value for one tuple.
func (fn *typedFn) eval(vals []tuple.Value) tuple.Value {
	switch fn.class {
	case classInt:
		return tuple.Int(fn.i(vals))
	case classFloat:
		return tuple.Float(fn.f(vals))
	case classString:
		return tuple.Str(fn.s(vals))
	}
	return tuple.Bool(fn.b(vals))
}

// asFloat widens an int expression to float, as the library does for
// mixed arithmetic and comparisons.
func (fn typedFn) asFloat() typedFn {
	if fn.class != classInt {
		return fn
	}
	i := fn.i
	return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return float64(i(v)) }}
}

// fastCompile compiles node if it is in the supported subset.
func fastCompile(node ast.Node, schema *tuple.Schema) (typedFn, bool) {
	switch n := node.(type) {
	case *ast.IdentifierNode:
		return fastField(n.Value, schema)
	case *ast.IntegerNode:
		c := int64(n.Value)
		return typedFn{class: classInt, i: func([]tuple.Value) int64 { return c }}, true
	case *ast.FloatNode:
		c := n.Value
		return typedFn{class: classFloat, f: func([]tuple.Value) float64 { return c }}, true
	case *ast.StringNode:
		c := n.Value
		return typedFn{class: classString, s: func([]tuple.Value) string { return c }}, true
	case *ast.BoolNode:
		c := n.Value
		return typedFn{class: classBool, b: func([]tuple.Value) bool { return c }}, true
	case *ast.ConstantNode:
		return fastConstant(n.Value)
	case *ast.UnaryNode:
		return fastUnary(n, schema)
	case *ast.BinaryNode:
		return fastBinary(n, schema)
	case *ast.ConditionalNode:
		return fastConditional(n, schema)
	}
	return typedFn{}, false
}

func fastField(name string, schema *tuple.Schema) (typedFn, bool) {
	i := schema.Index(name)
	if i < 0 {
		return typedFn{}, false
	}
	switch schema.Fields[i].Kind {
	case tuple.KindInt, tuple.KindTimestamp:
		return typedFn{class: classInt, i: func(v []tuple.Value) int64 { return v[i].I }}, true
	case tuple.KindFloat:
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return v[i].F }}, true
	case tuple.KindString, tuple.KindBytes:
		return typedFn{class: classString, s: func(v []tuple.Value) string { return v[i].S }}, true
	case tuple.KindBool:
		return typedFn{class: classBool, b: func(v []tuple.Value) bool { return v[i].I != 0 }}, true
	}
	return typedFn{}, false
}

func fastConstant(value any) (typedFn, bool) {
	switch c := value.(type) {
	case int:
		return fastConstant(int64(c))
	case int64:
		return typedFn{class: classInt, i: func([]tuple.Value) int64 { return c }}, true
	case float64:
		return typedFn{class: classFloat, f: func([]tuple.Value) float64 { return c }}, true
	case string:
		return typedFn{class: classString, s: func([]tuple.Value) string { return c }}, true
	case bool:
		return typedFn{class: classBool, b: func([]tuple.Value) bool { return c }}, true
	}
	return typedFn{}, false
}

func fastUnary(n *ast.UnaryNode, schema *tuple.Schema) (typedFn, bool) {
	x, ok := fastCompile(n.Node, schema)
	if !ok {
		return typedFn{}, false
	}
	switch {
	case (n.Operator == "!" || n.Operator == "not") && x.class == classBool:
		b := x.b
		return typedFn{class: classBool, b: func(v []tuple.Value) bool { return !b(v) }}, true
	case n.Operator == "-" && x.class == classInt:
		i := x.i
		return typedFn{class: classInt, i: func(v []tuple.Value) int64 { return -i(v) }}, true
	case n.Operator == "-" && x.class == classFloat:
		f := x.f
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return -f(v) }}, true
	case n.Operator == "+" && (x.class == classInt || x.class == classFloat):
		return x, true
	}
	return typedFn{}, false
}

func fastConditional(n *ast.ConditionalNode, schema *tuple.Schema) (typedFn, bool) {
	cond, ok1 := fastCompile(n.Cond, schema)
	a, ok2 := fastCompile(n.Exp1, schema)
	b, ok3 := fastCompile(n.Exp2, schema)
	if !ok1 || !ok2 || !ok3 || cond.class != classBool || a.class != b.class {
		return typedFn{}, false
	}
	c := cond.b
	switch a.class {
	case classInt:
		x, y := a.i, b.i
		return typedFn{class: classInt, i: func(v []tuple.Value) int64 {
			if c(v) {
				return x(v)
			}
			return y(v)
		}}, true
	case classFloat:
		x, y := a.f, b.f
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 {
			if c(v) {
				return x(v)
			}
			return y(v)
		}}, true
	case classString:
		x, y := a.s, b.s
		return typedFn{class: classString, s: func(v []tuple.Value) string {
			if c(v) {
				return x(v)
			}
			return y(v)
		}}, true
	case classBool:
		x, y := a.b, b.b
		return typedFn{class: classBool, b: func(v []tuple.Value) bool {
			if c(v) {
				return x(v)
			}
			return y(v)
		}}, true
	}
	return typedFn{}, false
}

func fastBinary(n *ast.BinaryNode, schema *tuple.Schema) (typedFn, bool) {
	l, ok1 := fastCompile(n.Left, schema)
	r, ok2 := fastCompile(n.Right, schema)
	if !ok1 || !ok2 {
		return typedFn{}, false
	}
	switch n.Operator {
	case "&&", "and", "||", "or":
		if l.class != classBool || r.class != classBool {
			return typedFn{}, false
		}
		x, y := l.b, r.b
		if n.Operator == "&&" || n.Operator == "and" {
			return typedFn{class: classBool, b: func(v []tuple.Value) bool { return x(v) && y(v) }}, true
		}
		return typedFn{class: classBool, b: func(v []tuple.Value) bool { return x(v) || y(v) }}, true
	case "==", "!=", "<", "<=", ">", ">=":
		return fastCompare(n.Operator, l, r)
	case "+", "-", "*", "/":
		return fastArithmetic(n.Operator, l, r)
	}
	return typedFn{}, false
}

// numericPair brings two numeric operands to one class: int if both are
// int, float otherwise.
func numericPair(l, r typedFn) (typedFn, typedFn, bool) {
	numeric := func(c valueClass) bool { return c == classInt || c == classFloat }
	if !numeric(l.class) || !numeric(r.class) {
		return l, r, false
	}
	if l.class != r.class {
		return l.asFloat(), r.asFloat(), true
	}
	return l, r, true
}

func fastCompare(op string, l, r typedFn) (typedFn, bool) {
	if nl, nr, ok := numericPair(l, r); ok {
		l, r = nl, nr
	} else if l.class != r.class || l.class == classNone {
		return typedFn{}, false
	}
	var b func([]tuple.Value) bool
	switch l.class {
	case classInt:
		b = compareFn(op, l.i, r.i)
	case classFloat:
		b = compareFn(op, l.f, r.f)
	case classString:
		b = compareFn(op, l.s, r.s)
	case classBool:
		x, y := l.b, r.b
		switch op {
		case "==":
			b = func(v []tuple.Value) bool { return x(v) == y(v) }
		case "!=":
			b = func(v []tuple.Value) bool { return x(v) != y(v) }
		}
	}
	if b == nil {
		return typedFn{}, false
	}
	return typedFn{class: classBool, b: b}, true
}

func compareFn[T int64 | float64 | string](op string, x, y func([]tuple.Value) T) func([]tuple.Value) bool {
	switch op {
	case "==":
		return func(v []tuple.Value) bool { return x(v) == y(v) }
	case "!=":
		return func(v []tuple.Value) bool { return x(v) != y(v) }
	case "<":
		return func(v []tuple.Value) bool { return x(v) < y(v) }
	case "<=":
		return func(v []tuple.Value) bool { return x(v) <= y(v) }
	case ">":
		return func(v []tuple.Value) bool { return x(v) > y(v) }
	case ">=":
		return func(v []tuple.Value) bool { return x(v) >= y(v) }
	}
	return nil
}

func fastArithmetic(op string, l, r typedFn) (typedFn, bool) {
	if op == "+" && l.class == classString && r.class == classString {
		x, y := l.s, r.s
		return typedFn{class: classString, s: func(v []tuple.Value) string { return x(v) + y(v) }}, true
	}
	l, r, ok := numericPair(l, r)
	if !ok {
		return typedFn{}, false
	}
	if op == "/" {
		// Always float division, like the library.
		l, r = l.asFloat(), r.asFloat()
	}
	if l.class == classInt {
		x, y := l.i, r.i
		switch op {
		case "+":
			return typedFn{class: classInt, i: func(v []tuple.Value) int64 { return x(v) + y(v) }}, true
		case "-":
			return typedFn{class: classInt, i: func(v []tuple.Value) int64 { return x(v) - y(v) }}, true
		case "*":
			return typedFn{class: classInt, i: func(v []tuple.Value) int64 { return x(v) * y(v) }}, true
		}
		return typedFn{}, false
	}
	x, y := l.f, r.f
	switch op {
	case "+":
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return x(v) + y(v) }}, true
	case "-":
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return x(v) - y(v) }}, true
	case "*":
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return x(v) * y(v) }}, true
	case "/":
		return typedFn{class: classFloat, f: func(v []tuple.Value) float64 { return x(v) / y(v) }}, true
	}
	return typedFn{}, false
}

// staticClass is the class of a checked expression's static type.
func staticClass(t reflect.Type) valueClass {
	switch k, _ := kindOfType(t); k {
	case tuple.KindInt:
		return classInt
	case tuple.KindFloat:
		return classFloat
	case tuple.KindString:
		return classString
	case tuple.KindBool:
		return classBool
	}
	return classNone
}
