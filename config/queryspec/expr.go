package queryspec

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"

	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrInvalidExpression is wrapped by errors from CompileWhere, CompileExpr
// and ParseAggregate.
var ErrInvalidExpression = errors.New("invalid expression")

type exprError struct{ msg string }

func (e *exprError) Error() string { return e.msg }
func (e *exprError) Unwrap() error { return ErrInvalidExpression }

func exprErrorf(format string, args ...any) error {
	return &exprError{fmt.Sprintf(format, args...)}
}

// EnvFor is the expression environment for tuples of the schema: one entry
// per field holding a zero value of the Go type the field has inside
// expressions: int -> int64, float -> float64, string -> string,
// bool -> bool, timestamp -> int64 (nanoseconds since the Unix epoch),
// bytes -> string. Operators fill a map of this shape per tuple.
func EnvFor(schema *tuple.Schema) map[string]any {
	env := make(map[string]any, schema.Len())
	for _, f := range schema.Fields {
		env[f.Name] = ZeroFor(f.Kind)
	}
	return env
}

// ZeroFor is the zero value of the Go type a field of kind k has inside
// expressions (see EnvFor).
func ZeroFor(k tuple.Kind) any {
	switch k {
	case tuple.KindInt, tuple.KindTimestamp:
		return int64(0)
	case tuple.KindFloat:
		return float64(0)
	case tuple.KindBool:
		return false
	default: // string, bytes
		return ""
	}
}

// ExprOptions are the compile options every fedstream expression uses: the
// schema's environment, UTC as the time zone and no now() builtin, so that
// replicas evaluating the same tuple get the same answer on any host, and
// a cost meter around every predicate body (see budget.go). m is the meter
// the compiled program charges when it runs; nil when the program is only
// checked (validation).
func ExprOptions(schema *tuple.Schema, m *Meter) []expr.Option {
	return append([]expr.Option{
		expr.Env(EnvFor(schema)),
		expr.DisableBuiltin("now"),
		expr.Timezone("UTC"),
	}, meteredOptions(m)...)
}

// CompileWhere compiles a filter predicate; it must yield bool.
func CompileWhere(where string, in *tuple.Schema) (*vm.Program, error) {
	return compileWhere(where, in, "")
}

// CompileExpr compiles a map expression and returns the kind of its result.
func CompileExpr(expression string, in *tuple.Schema) (*vm.Program, tuple.Kind, error) {
	return compileExpr(expression, in, "")
}

func compileWhere(where string, in *tuple.Schema, inputName string) (*vm.Program, error) {
	if strings.TrimSpace(where) == "" {
		return nil, exprErrorf("empty expression")
	}
	p, err := expr.Compile(where, append(ExprOptions(in, nil), expr.AsBool())...)
	if err != nil {
		return nil, describeCompileError(err, in, inputName)
	}
	if err := checkStaticCost(where); err != nil {
		return nil, err
	}
	return p, nil
}

func compileExpr(expression string, in *tuple.Schema, inputName string) (*vm.Program, tuple.Kind, error) {
	if strings.TrimSpace(expression) == "" {
		return nil, tuple.KindInvalid, exprErrorf("empty expression")
	}
	p, err := expr.Compile(expression, ExprOptions(in, nil)...)
	if err != nil {
		return nil, tuple.KindInvalid, describeCompileError(err, in, inputName)
	}
	if err := checkStaticCost(expression); err != nil {
		return nil, tuple.KindInvalid, err
	}
	t := p.Node().Type()
	k := kindOfGoType(t)
	if k == tuple.KindInvalid {
		name := "unknown"
		if t != nil {
			name = t.String()
		}
		return nil, k, exprErrorf("expression %q has type %s; want one that yields int, float, string or bool", expression, name)
	}
	return p, k, nil
}

// kindOfGoType maps the static type of a compiled expression to a field
// kind. Any integer type is int (expr literals are Go int).
func kindOfGoType(t reflect.Type) tuple.Kind {
	if t == nil {
		return tuple.KindInvalid
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return tuple.KindInt
	case reflect.Float32, reflect.Float64:
		return tuple.KindFloat
	case reflect.String:
		return tuple.KindString
	case reflect.Bool:
		return tuple.KindBool
	}
	return tuple.KindInvalid
}

var unknownNameRE = regexp.MustCompile(`^unknown name (\S+)`)

// describeCompileError turns expr's compile error into one line that names
// the offending field and lists what the input has.
func describeCompileError(err error, in *tuple.Schema, inputName string) error {
	var fe *file.Error
	msg, where := err.Error(), ""
	if errors.As(err, &fe) {
		msg = fe.Message
		if fe.Line > 0 {
			where = fmt.Sprintf(" (at %d:%d)", fe.Line, fe.Column+1)
		}
	}
	if m := unknownNameRE.FindStringSubmatch(msg); m != nil {
		if m[1] == "now" {
			return exprErrorf("now() is not available: replicas must compute identical results, so expressions cannot read the wall clock")
		}
		return exprErrorf("unknown field %q (%s has: %s)", m[1], inputLabel(inputName), fieldList(in))
	}
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return exprErrorf("%s%s", msg, where)
}

func inputLabel(inputName string) string {
	if inputName == "" {
		return "input"
	}
	return "input " + inputName
}

func fieldList(s *tuple.Schema) string {
	names := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		names[i] = f.Name
	}
	return strings.Join(names, ", ")
}

// AggFunc names an aggregate function.
type AggFunc string

// The aggregate functions.
const (
	AggCount         AggFunc = "count"
	AggSum           AggFunc = "sum"
	AggAvg           AggFunc = "avg"
	AggMin           AggFunc = "min"
	AggMax           AggFunc = "max"
	AggCountDistinct AggFunc = "count_distinct"
)

// AggCall is a parsed aggregate such as "sum(bytes)".
type AggCall struct {
	Func  AggFunc
	Field string // empty for count()
}

var aggRE = regexp.MustCompile(`^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)?\s*\)\s*$`)

// ParseAggregate parses "count()", "sum(f)", "avg(f)", "min(f)", "max(f)" or
// "count_distinct(f)". It checks the syntax only; see AggregateKind for types.
func ParseAggregate(s string) (AggCall, error) {
	m := aggRE.FindStringSubmatch(s)
	if m == nil {
		return AggCall{}, exprErrorf("%q is not an aggregate call; want count(), sum(f), avg(f), min(f), max(f) or count_distinct(f)", s)
	}
	fn, field := AggFunc(m[1]), m[2]
	switch fn {
	case AggCount:
		if field != "" {
			return AggCall{}, exprErrorf("count takes no argument: write count()")
		}
	case AggSum, AggAvg, AggMin, AggMax, AggCountDistinct:
		if field == "" {
			return AggCall{}, exprErrorf("%s needs a field: write %s(field)", fn, fn)
		}
	default:
		return AggCall{}, exprErrorf("unknown aggregate function %q (want count, sum, avg, min, max, count_distinct)", m[1])
	}
	return AggCall{Func: fn, Field: field}, nil
}

// AggregateKind is the output kind of an aggregate whose argument has kind
// arg (ignored for count): count and count_distinct -> int; sum -> the
// argument's kind (int or float); avg -> float; min/max -> the argument's
// kind (int, float, timestamp or string).
func AggregateKind(c AggCall, arg tuple.Kind) (tuple.Kind, error) {
	switch c.Func {
	case AggCount, AggCountDistinct:
		return tuple.KindInt, nil
	case AggSum, AggAvg:
		if arg != tuple.KindInt && arg != tuple.KindFloat {
			return tuple.KindInvalid, exprErrorf("%s(%s): field %q is %s; %s needs int or float", c.Func, c.Field, c.Field, arg, c.Func)
		}
		if c.Func == AggAvg {
			return tuple.KindFloat, nil
		}
		return arg, nil
	case AggMin, AggMax:
		switch arg {
		case tuple.KindInt, tuple.KindFloat, tuple.KindTimestamp, tuple.KindString:
			return arg, nil
		}
		return tuple.KindInvalid, exprErrorf("%s(%s): field %q is %s; %s needs int, float, timestamp or string", c.Func, c.Field, c.Field, arg, c.Func)
	}
	return tuple.KindInvalid, exprErrorf("unknown aggregate function %q", c.Func)
}
