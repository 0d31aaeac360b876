package operator

import (
	"fmt"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// union passes tuples from any of its ports through unchanged. All inputs
// must have the same schema. It is stateless; ordering across ports is the
// caller's (SUnion's) business.
type union struct {
	stateless
	schema *tuple.Schema
	ports  int
}

func newUnion(def *queryspec.Operator, inputs []*tuple.Schema) (*union, error) {
	if len(inputs) == 0 {
		return nil, defErr(def, ErrBadDefinition, "no input schemas")
	}
	if len(def.Inputs) != 0 && len(def.Inputs) != len(inputs) {
		return nil, defErr(def, ErrBadDefinition, "inputs names %d streams but %d schemas were given", len(def.Inputs), len(inputs))
	}
	first := schemaSignature(inputs[0])
	for i, s := range inputs[1:] {
		if got := schemaSignature(s); got != first {
			return nil, defErr(def, ErrTypeMismatch, "input %d has schema %s, input 0 has %s", i+1, got, first)
		}
	}
	return &union{
		stateless: stateless{signature: "union" + first},
		schema:    inputs[0],
		ports:     len(inputs),
	}, nil
}

func (u *union) Process(port int, t *tuple.Tuple, out Emitter) error {
	if port < 0 || port >= u.ports {
		return fmt.Errorf("%w: union has ports 0..%d, got %d", ErrBadPort, u.ports-1, port)
	}
	if err := checkData(t, u.schema); err != nil {
		return err
	}
	if err := checkKinds(t, u.schema); err != nil {
		return err
	}
	out.Emit(t)
	return nil
}

func (u *union) OutputSchema() *tuple.Schema { return u.schema }
