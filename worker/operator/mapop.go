package operator

import (
	"fmt"
	"strings"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// mapOp computes one output field per `fields` entry, in order. It is
// stateless. An entry that is just an input field's name is copied
// directly, with the kind an expression would see (exprKind: timestamps
// become int, bytes string); any other entry
// is a compiled expression whose static type gives the output kind.
type mapOp struct {
	stateless
	in       *tuple.Schema
	outSch   *tuple.Schema
	env      *exprEnv
	exprs    []*compiledExpr // nil for copied fields
	copyFrom []int           // input index for copied fields, -1 otherwise
	// projection is set when every output field is a copied input field
	// (a pure projection): Process then neither binds the environment nor
	// looks at exprs, and copies values in one pass over copies.
	projection bool
	copies     []fieldCopy // one per output field when projection
	out        tuple.Tuple // reused output tuple
}

// fieldCopy is one output field of a pure projection.
type fieldCopy struct {
	from    int        // input index
	inKind  tuple.Kind // kind the input value must have (schema's)
	outKind tuple.Kind // kind of the output value (exprKind(inKind))
}

func newMap(def *queryspec.Operator, in *tuple.Schema) (*mapOp, error) {
	if len(def.Fields) == 0 {
		return nil, defErr(def, ErrBadDefinition, "fields is required")
	}
	m := &mapOp{
		in:       in,
		env:      newExprEnv(in),
		exprs:    make([]*compiledExpr, len(def.Fields)),
		copyFrom: make([]int, len(def.Fields)),
	}
	fields := make([]tuple.Field, len(def.Fields))
	seen := make(map[string]bool, len(def.Fields))
	for i, fe := range def.Fields {
		if fe.Name == "" {
			return nil, defErr(def, ErrBadDefinition, "field %d has no name", i)
		}
		if seen[fe.Name] {
			return nil, defErr(def, ErrBadDefinition, "field %q is defined twice", fe.Name)
		}
		seen[fe.Name] = true
		m.copyFrom[i] = -1
		if j := in.Index(strings.TrimSpace(fe.Expr)); j >= 0 {
			m.copyFrom[i] = j
			m.env.reference(in.Fields[j].Name) // so bind checks its kind
			fields[i] = tuple.Field{Name: fe.Name, Kind: exprKind(in.Fields[j].Kind)}
			continue
		}
		c, err := m.env.compile(fe.Expr, false)
		if err != nil {
			return nil, fmt.Errorf("operator %q (map): field %q = %q: %w: %w", def.Name, fe.Name, fe.Expr, ErrBadExpression, err)
		}
		if c.kind == tuple.KindInvalid {
			return nil, defErr(def, ErrTypeMismatch,
				"field %q = %q has type %v; want int, float, string or bool (convert with int(), float() or string())",
				fe.Name, fe.Expr, c.program.Node().Type())
		}
		m.exprs[i] = c
		fields[i] = tuple.Field{Name: fe.Name, Kind: c.kind}
	}
	m.outSch = tuple.NewSchema(fields)
	m.projection = true
	for i, j := range m.copyFrom {
		if j < 0 {
			m.projection = false
			break
		}
		m.copies = append(m.copies, fieldCopy{from: j, inKind: in.Fields[j].Kind, outKind: fields[i].Kind})
	}
	if !m.projection {
		m.copies = nil
	}
	m.out.Values = make([]tuple.Value, len(fields))
	m.stateless = stateless{signature: "map" + schemaSignature(in) + schemaSignature(m.outSch)}
	return m, nil
}

func (m *mapOp) Process(port int, t *tuple.Tuple, out Emitter) error {
	if port != 0 {
		return fmt.Errorf("%w: map has port 0 only, got %d", ErrBadPort, port)
	}
	if err := checkData(t, m.in); err != nil {
		return err
	}
	if m.projection {
		return m.project(t, out)
	}
	if err := m.env.bind(t); err != nil {
		return err
	}
	for i, c := range m.exprs {
		if j := m.copyFrom[i]; j >= 0 {
			m.out.Values[i] = t.Values[j]
			m.out.Values[i].Kind = m.outSch.Fields[i].Kind
			continue
		}
		v, err := m.env.evalValue(c, t)
		if err != nil {
			return fmt.Errorf("field %q: %w", m.outSch.Fields[i].Name, err)
		}
		m.out.Values[i] = v
	}
	m.out.Type, m.out.ID, m.out.STime, m.out.Version = t.Type, t.ID, t.STime, t.Version
	out.Emit(&m.out)
	return nil
}

// project is Process for a pure projection. It checks each copied value's
// kind as bind would; on a mismatch it returns bind's error, so that the
// message (and which field it names) is the same as on the general path.
func (m *mapOp) project(t *tuple.Tuple, out Emitter) error {
	src, dst := t.Values, m.out.Values[:len(m.copies)]
	for i := range m.copies {
		c := &m.copies[i]
		v := &src[c.from]
		if v.Kind != c.inKind {
			if err := m.env.bind(t); err != nil {
				return err
			}
			return fmt.Errorf("%w: field %q is %s, schema says %s", ErrTypeMismatch, m.in.Fields[c.from].Name, v.Kind, c.inKind)
		}
		// Field by field, not as one struct copy: the source's values
		// were usually just written field by field (by a generator or a
		// decoder), and the struct copy's 16-byte loads over those
		// narrower pending stores cannot be forwarded from the store
		// buffer; the stall was 6 % of the sending worker's CPU in the
		// forward benchmark.
		d := &dst[i]
		d.Kind, d.I, d.F, d.S = c.outKind, v.I, v.F, v.S
	}
	m.out.Type, m.out.ID, m.out.STime, m.out.Version = t.Type, t.ID, t.STime, t.Version
	out.Emit(&m.out)
	return nil
}

func (m *mapOp) OutputSchema() *tuple.Schema { return m.outSch }

// exprKind is the kind a field has once it passes through an expression:
// timestamps are int64 and bytes are strings there.
func exprKind(k tuple.Kind) tuple.Kind {
	switch k {
	case tuple.KindTimestamp:
		return tuple.KindInt
	case tuple.KindBytes:
		return tuple.KindString
	}
	return k
}
