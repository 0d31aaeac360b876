package queryspec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Parse reads a query from YAML, fills in defaults and validates it.
// filename only labels error messages. Unknown fields are errors. The error,
// if any, lists every problem found, one per line, each naming the file, the
// line, the field path and what is wrong.
func Parse(filename string, data []byte) (*Query, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, syntaxError(filename, err, nil)
	}
	if root.Kind == 0 || (root.Kind == yaml.DocumentNode && len(root.Content) == 0) {
		return nil, &FieldError{File: filename, Msg: "empty document: want a query mapping (name, sources, operators, sinks)", kind: ErrSyntax}
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode {
		doc = doc.Content[0]
	}
	if doc.Kind != yaml.MappingNode {
		return nil, &FieldError{File: filename, Line: doc.Line, Msg: "a query must be a mapping (name, sources, operators, sinks)", kind: ErrSyntax}
	}
	idx := newLineIndex()
	idx.walk(doc, "")

	var q Query
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// A type error (an unknown field, a value of the wrong shape) leaves
	// the rest of the document decoded: validation still runs, so that
	// one typo does not hide every other problem.
	var shapeErrs []error
	if err := dec.Decode(&q); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, syntaxError(filename, err, idx)
		}
		shapeErrs = unjoin(syntaxError(filename, err, idx))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		line := extra.Line
		if err != nil {
			return nil, syntaxError(filename, err, idx)
		}
		return nil, &FieldError{File: filename, Line: line, Msg: "more than one YAML document: a file holds one query", kind: ErrSyntax}
	}
	q.lines = idx.lines
	errs := append(shapeErrs, unjoin(q.Validate(filename))...)
	if len(errs) > 0 {
		sortByLine(errs)
		return nil, errors.Join(errs...)
	}
	return &q, nil
}

// unjoin lists the errors errors.Join put together (nil gives none).
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// sortByLine orders problems by their YAML line, keeping the order of
// those on one line (or without one).
func sortByLine(errs []error) {
	line := func(err error) int {
		var fe *FieldError
		if errors.As(err, &fe) {
			return fe.Line
		}
		return 0
	}
	sort.SliceStable(errs, func(i, j int) bool { return line(errs[i]) < line(errs[j]) })
}

// FromJSON reads the canonical JSON form (as stored in Raft and sent to
// workers). The input is trusted to come from CanonicalJSON, but it is still
// validated so that a corrupt or hand-edited record fails loudly here rather
// than inside a worker.
func FromJSON(b []byte) (*Query, error) {
	var q Query
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return nil, &FieldError{Msg: "query JSON: " + err.Error(), kind: ErrSyntax}
	}
	if dec.More() {
		return nil, &FieldError{Msg: "query JSON: trailing data after the query object", kind: ErrSyntax}
	}
	if err := q.Validate(""); err != nil {
		return nil, err
	}
	return &q, nil
}

// CanonicalJSON is the stored form of a validated query: defaults filled in,
// type names canonical, schemas and expressions as ordered lists. Equal
// queries produce equal bytes.
func (q *Query) CanonicalJSON() ([]byte, error) {
	if err := q.Validate(""); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep "a > b" readable in stored expressions
	if err := enc.Encode(q); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// lineIndex remembers where each field path sits in the YAML text.
type lineIndex struct {
	lines  map[string]int    // path -> line of its key (or list element)
	byLine map[int][]string  // line -> paths starting on it
	labels map[string]string // list element path -> its "name" value
	// values: path -> its value's YAML tag and, for scalars, text
	// ("!!seq", "!!str x"), to tell which key of a line a type error is
	// about.
	values map[string]string
}

func newLineIndex() *lineIndex {
	return &lineIndex{lines: map[string]int{}, byLine: map[int][]string{}, labels: map[string]string{}, values: map[string]string{}}
}

// valueKey is how values records a node.
func valueKey(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.ShortTag() + " " + n.Value
	}
	return n.ShortTag()
}

func (ix *lineIndex) record(p string, line int) {
	if _, dup := ix.lines[p]; !dup {
		ix.lines[p] = line
		ix.byLine[line] = append(ix.byLine[line], p)
	}
}

// walk records the line of every mapping key and sequence element below n.
// Depth is bounded by the YAML parser itself; aliases are not followed so
// that alias bombs cannot make this quadratic.
func (ix *lineIndex) walk(n *yaml.Node, p string) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			child := k.Value
			if p != "" {
				child = p + "." + k.Value
			}
			ix.record(child, k.Line)
			ix.values[child] = valueKey(v)
			if k.Value == "name" && v.Kind == yaml.ScalarNode && strings.HasSuffix(p, "]") {
				ix.labels[p] = v.Value
			}
			ix.walk(v, child)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			child := fmt.Sprintf("%s[%d]", p, i)
			ix.record(child, c.Line)
			ix.walk(c, child)
		}
	}
}

// display turns "operators[2].where" into "operators[2] (busy).where".
func (ix *lineIndex) display(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		b.WriteByte(p[i])
		if p[i] == ']' {
			if l, ok := ix.labels[p[:i+1]]; ok {
				b.WriteString(" (" + l + ")")
			}
		}
	}
	return b.String()
}

var (
	yamlLineRE     = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
	unknownFieldRE = regexp.MustCompile(`^field (\S+) not found in type \S*?\.?(\w+)$`)
	unmarshalRE    = regexp.MustCompile("^cannot unmarshal !!(\\w+) (?:`(.*)` )?into (\\S+)$")
)

func yamlTagName(tag string) string {
	switch tag {
	case "str":
		return "string"
	case "seq":
		return "list"
	case "map":
		return "mapping"
	}
	return tag
}

func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	case t == "bool":
		return "true or false"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "queryspec."):
		return "a mapping (" + strings.ToLower(strings.TrimPrefix(t, "queryspec.")) + ")"
	}
	return t
}

// syntaxError rewrites yaml.v3 errors into FieldErrors that carry the file,
// line and (when the line index can tell) the field path.
func syntaxError(filename string, err error, idx *lineIndex) error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	var out []error
	for _, m := range msgs {
		fe := &FieldError{File: filename, Msg: strings.TrimPrefix(m, "yaml: "), kind: ErrSyntax}
		if sm := yamlLineRE.FindStringSubmatch(m); sm != nil {
			fe.Line, _ = strconv.Atoi(sm[1])
			fe.Msg = sm[2]
		}
		if idx != nil && fe.Line > 0 {
			if um := unknownFieldRE.FindStringSubmatch(fe.Msg); um != nil {
				field, typ := um[1], um[2]
				fe.Msg = fmt.Sprintf("unknown field %q", field)
				if known := knownFields[typ]; known != "" {
					fe.Msg += " (want one of: " + known + ")"
				}
				for _, p := range idx.byLine[fe.Line] {
					if p == field || strings.HasSuffix(p, "."+field) {
						fe.Path = idx.display(p)
						break
					}
				}
			} else if ps := idx.byLine[fe.Line]; len(ps) == 1 {
				fe.Path = idx.display(ps[0])
			} else if um := unmarshalRE.FindStringSubmatch(fe.Msg); um != nil {
				// Several keys on the line (a flow mapping): the one
				// whose value has the offending tag (and text).
				want := "!!" + um[1]
				if um[2] != "" {
					want += " " + um[2]
				}
				var match []string
				for _, p := range ps {
					if idx.values[p] == want {
						match = append(match, p)
					}
				}
				if len(match) == 1 {
					fe.Path = idx.display(match[0])
				}
			}
		}
		if um := unmarshalRE.FindStringSubmatch(fe.Msg); um != nil {
			if um[2] == "" {
				fe.Msg = fmt.Sprintf("cannot use a %s here: want %s", yamlTagName(um[1]), goTypeName(um[3]))
			} else {
				fe.Msg = fmt.Sprintf("cannot use %s %q here: want %s", yamlTagName(um[1]), um[2], goTypeName(um[3]))
			}
		}
		out = append(out, fe)
	}
	return errors.Join(out...)
}

// knownFields lists the YAML field names of each spec type, for messages
// about unknown fields ("want one of: ...").
var knownFields = func() map[string]string {
	m := map[string]string{}
	for _, v := range []any{Query{}, Availability{}, Source{}, Generator{}, Operator{}, Window{}, Sink{}, Field{}, NamedExpr{}, KafkaSource{}, KafkaSink{}} {
		t := reflect.TypeOf(v)
		var names []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			names = append(names, name)
		}
		sort.Strings(names)
		m[t.Name()] = strings.Join(names, ", ")
	}
	return m
}()
