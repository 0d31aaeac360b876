package operator

import (
	"fmt"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// filter emits the input tuples for which its `where` predicate is true,
// unchanged. It is stateless.
type filter struct {
	stateless
	schema *tuple.Schema
	env    *exprEnv
	where  *compiledExpr
}

func newFilter(def *queryspec.Operator, in *tuple.Schema) (*filter, error) {
	if def.Where == "" {
		return nil, defErr(def, ErrBadDefinition, "where is required")
	}
	env := newExprEnv(in)
	where, err := env.compile(def.Where, true)
	if err != nil {
		return nil, fmt.Errorf("operator %q (filter): where %q: %w: %w", def.Name, def.Where, ErrBadExpression, err)
	}
	return &filter{
		stateless: stateless{signature: "filter" + schemaSignature(in)},
		schema:    in,
		env:       env,
		where:     where,
	}, nil
}

func (f *filter) Process(port int, t *tuple.Tuple, out Emitter) error {
	if port != 0 {
		return fmt.Errorf("%w: filter has port 0 only, got %d", ErrBadPort, port)
	}
	if err := checkData(t, f.schema); err != nil {
		return err
	}
	if err := f.env.bind(t); err != nil {
		return err
	}
	keep, err := f.env.evalBool(f.where, t)
	if err != nil {
		return fmt.Errorf("where: %w", err)
	}
	if keep {
		out.Emit(t)
	}
	return nil
}

func (f *filter) OutputSchema() *tuple.Schema { return f.schema }
