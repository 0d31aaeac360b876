package operator

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// split tokenises one string field: for every input tuple it emits one tuple
// per whitespace-separated token (strings.Fields semantics: separators are
// runs of Unicode white space; an empty or all-space string emits nothing).
// An output tuple holds every input field except the split one, in order,
// then the token. It is stateless.
//
// Process allocates nothing per token: tokens are slices of the input string
// (or, with lower, of its lower-cased copy, made at most once per tuple and
// only when the string has something to lower), and all tokens of a tuple are
// emitted through one reused output tuple. Per the Emitter contract the
// emitted tuple and its values are valid only during Emit.
type split struct {
	stateless
	in     *tuple.Schema
	outSch *tuple.Schema
	field  int  // index of the split field in the input
	lower  bool // lower-case tokens
	out    tuple.Tuple
}

func newSplit(def *queryspec.Operator, in *tuple.Schema) (*split, error) {
	if def.Field == "" {
		return nil, defErr(def, ErrBadDefinition, "field is required")
	}
	j := in.Index(def.Field)
	if j < 0 {
		return nil, defErr(def, ErrUnknownField, "field %q is not in the input schema %s", def.Field, schemaSignature(in))
	}
	if k := in.Fields[j].Kind; k != tuple.KindString {
		return nil, defErr(def, ErrTypeMismatch, "field %q is %s; split needs a string", def.Field, k)
	}
	as := def.As
	if as == "" {
		as = queryspec.DefaultSplitAs
	}
	fields := make([]tuple.Field, 0, in.Len())
	for i, f := range in.Fields {
		if i == j {
			continue
		}
		if f.Name == as {
			return nil, defErr(def, ErrBadDefinition, "as %q is already a field of the input", as)
		}
		fields = append(fields, f)
	}
	fields = append(fields, tuple.Field{Name: as, Kind: tuple.KindString})
	s := &split{
		in:     in,
		outSch: tuple.NewSchema(fields),
		field:  j,
		lower:  def.Lower,
	}
	s.out.Values = make([]tuple.Value, len(fields))
	s.stateless = stateless{signature: fmt.Sprintf("split%s/%s/lower=%t%s",
		schemaSignature(in), def.Field, def.Lower, schemaSignature(s.outSch))}
	return s, nil
}

func (s *split) Process(port int, t *tuple.Tuple, out Emitter) error {
	if port != 0 {
		return fmt.Errorf("%w: split has port 0 only, got %d", ErrBadPort, port)
	}
	if err := checkData(t, s.in); err != nil {
		return err
	}
	// Every input value is either forwarded or split, so check them all.
	if err := checkKinds(t, s.in); err != nil {
		return err
	}
	line := t.Values[s.field].S
	if s.lower {
		// Lowering never turns a non-space rune into a space or back, so
		// tokenising the lowered line gives the lowered tokens. ToLower
		// returns line itself when there is nothing to lower.
		line = strings.ToLower(line)
	}
	last := len(s.out.Values) - 1
	for start, end := NextToken(line, 0); start < end; start, end = NextToken(line, end) {
		// The header and forwarded values are rewritten for every token: an
		// emitter may modify the tuple it is given (the task sets ids).
		s.out.Type, s.out.ID, s.out.STime, s.out.Version = t.Type, t.ID, t.STime, t.Version
		copy(s.out.Values[:s.field], t.Values[:s.field])
		copy(s.out.Values[s.field:last], t.Values[s.field+1:s.in.Len()])
		s.out.Values[last] = tuple.Value{Kind: tuple.KindString, S: line[start:end]}
		out.Emit(&s.out)
	}
	return nil
}

func (s *split) OutputSchema() *tuple.Schema { return s.outSch }

// asciiSpace marks the ASCII bytes unicode.IsSpace accepts.
var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// NextToken finds the first token of s at or after byte i: s[start:end] is
// a maximal run of non-space runes. When there is none, start == end ==
// len(s). Invalid UTF-8 bytes are not space, as in strings.Fields. ASCII is
// decided by table lookup in the loops themselves (a helper would not be
// inlined); only non-ASCII bytes are decoded. It is exported so that code
// outside the engine (the benchmark's hand-written baseline) tokenises by
// exactly the split operator's rules.
func NextToken(s string, i int) (start, end int) {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if !asciiSpace[c] {
				break
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += w
	}
	start = i
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if asciiSpace[c] {
				break
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			break
		}
		i += w
	}
	return start, i
}
