package operator

import (
	"errors"
	"fmt"
)

// ErrUnknownOperator is returned by New for an operator type it does not know.
var ErrUnknownOperator = errors.New("unknown operator type")

// ErrBadDefinition is returned by New when a definition is incomplete or
// inconsistent (missing window, wrong number of inputs, bad aggregate, ...).
var ErrBadDefinition = errors.New("invalid operator definition")

// ErrUnknownField is returned by New when a definition names a field that
// the input schema does not have.
var ErrUnknownField = errors.New("unknown field")

// ErrTypeMismatch is returned when a field's or expression's type does not
// fit its use (sum of a string, join keys of different kinds, a tuple whose
// values do not match the schema, ...).
var ErrTypeMismatch = errors.New("type mismatch")

// ErrBadExpression is returned by New when a filter or map expression does
// not compile against the input schema; the wrapped error from the
// expression library names the position and the problem.
var ErrBadExpression = errors.New("invalid expression")

// ErrBadPort is returned by Process for an input port the operator lacks.
var ErrBadPort = errors.New("no such input port")

// ErrNotData is returned by Process for a tuple that carries no values
// (BOUNDARY, UNDO, REC_DONE): those are handled by the task, not operators.
var ErrNotData = errors.New("not a data tuple")

// ErrEval is returned by Process when an expression fails at run time
// (division by zero, result of an unexpected type, ...).
var ErrEval = errors.New("expression evaluation failed")

// ErrSumOverflow is returned (wrapped) by an aggregate's Process for a
// tuple that would take an int sum (sum or avg of an int field) past the
// int64 range; the tuple is not counted. It wraps ErrEval, so the task
// drops, counts and reports the tuple like a failed expression.
var ErrSumOverflow = fmt.Errorf("%w: int sum out of the int64 range", ErrEval)

// ErrBadSnapshot is returned by Restore for state that is truncated,
// corrupt, or was taken from an operator of a different definition.
var ErrBadSnapshot = errors.New("invalid operator snapshot")
