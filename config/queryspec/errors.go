package queryspec

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidQuery is wrapped by every validation problem (see FieldError):
// the query is well-formed YAML/JSON but breaks a rule of the format.
var ErrInvalidQuery = errors.New("invalid query")

// ErrSyntax is wrapped by errors for input that is not a well-formed query
// document (malformed YAML or JSON, wrong value shapes, unknown fields).
var ErrSyntax = errors.New("malformed query document")

// FieldError is one problem found in a query. Its message names the file,
// the YAML line when known, the field path and what is wrong:
//
//	netmon.yaml: line 14: operators[2] (busy).where: unknown field "conn" (...)
type FieldError struct {
	File string
	Line int    // 0 when unknown (e.g. queries read from JSON)
	Path string // e.g. `operators[2] (busy).where`
	Msg  string
	kind error // ErrInvalidQuery or ErrSyntax
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidQuery) (or ErrSyntax) hold.
func (e *FieldError) Unwrap() error {
	if e.kind == nil {
		return ErrInvalidQuery
	}
	return e.kind
}

// path is a field location in two spellings: key is the plain path used to
// look up YAML line numbers ("operators[2].where"); display adds node names
// for humans ("operators[2] (busy).where").
type path struct{ key, display string }

func rootPath(field string) path { return path{field, field} }

func (p path) field(name string) path {
	if p.key == "" {
		return rootPath(name)
	}
	return path{p.key + "." + name, p.display + "." + name}
}

// elem is the i-th element of a list; label (a node name) is shown when set.
func (p path) elem(i int, label string) path {
	idx := fmt.Sprintf("[%d]", i)
	d := p.display + idx
	if label != "" {
		d += " (" + label + ")"
	}
	return path{p.key + idx, d}
}

// problems collects every FieldError of one validation pass.
type problems struct {
	file  string
	lines map[string]int
	errs  []error
}

func (ps *problems) add(p path, format string, args ...any) {
	ps.errs = append(ps.errs, &FieldError{
		File: ps.file,
		Line: ps.lineOf(p.key),
		Path: p.display,
		Msg:  fmt.Sprintf(format, args...),
	})
}

// lineOf returns the line of the path, or of its nearest ancestor that has
// one (a missing field is reported at the line of its parent).
func (ps *problems) lineOf(key string) int {
	for key != "" {
		if l, ok := ps.lines[key]; ok {
			return l
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

func (ps *problems) err() error { return errors.Join(ps.errs...) }
