package source

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrBadRecord is wrapped by every LineError.
var ErrBadRecord = errors.New("bad ingest record")

// LineError describes why one ingest line was rejected:
//
//	line 7: field "port": want int, got string "x"
type LineError struct {
	Line  uint64
	Field string // empty when the problem is not about one field
	Msg   string
}

func (e *LineError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("line %d: field %q: %s", e.Line, e.Field, e.Msg)
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// Unwrap makes errors.Is(err, ErrBadRecord) hold.
func (e *LineError) Unwrap() error { return ErrBadRecord }

// LineParser turns JSON-lines records into tuples of a schema. Each line is
// one JSON object holding exactly the schema's fields (missing and unknown
// fields are errors). Types: int wants an integral JSON number; float any
// number; string and bytes (base64) a string; bool true/false; timestamp an
// RFC 3339 string or integer nanoseconds since the Unix epoch. A parser is
// not safe for concurrent use.
type LineParser struct {
	schema  *tuple.Schema
	stimeAt int // index of the first timestamp field, or -1
	raw     map[string]json.RawMessage
}

// NewLineParser returns a parser for records of the schema.
func NewLineParser(schema *tuple.Schema) *LineParser {
	p := &LineParser{schema: schema, stimeAt: -1, raw: make(map[string]json.RawMessage, schema.Len())}
	for i, f := range schema.Fields {
		if f.Kind == tuple.KindTimestamp {
			p.stimeAt = i
			break
		}
	}
	return p
}

// Parse fills t.Values and t.STime from one line; lineNo labels errors.
// STime is the first timestamp field's value, whatever it is (0, the Unix
// epoch, is a time like any other), or 0 when the schema has no timestamp
// field: the source then stamps the arrival time, and must decide that by
// the schema, never by the value.
func (p *LineParser) Parse(lineNo uint64, line []byte, t *tuple.Tuple) error {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return &LineError{Line: lineNo, Msg: "empty line: want a JSON object"}
	}
	if !utf8.Valid(line) {
		// JSON text is UTF-8; this is most likely binary data. The excerpt
		// is escaped: messages travel in proto strings, which must be
		// valid UTF-8.
		return &LineError{Line: lineNo, Msg: "not valid UTF-8 (binary data?): " + excerpt(line)}
	}
	if line[0] != '{' {
		return &LineError{Line: lineNo, Msg: "want a JSON object, got " + describe(line)}
	}
	clear(p.raw)
	if err := json.Unmarshal(line, &p.raw); err != nil {
		return &LineError{Line: lineNo, Msg: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	values := t.Values[:0]
	for _, f := range p.schema.Fields {
		raw, ok := p.raw[f.Name]
		if !ok {
			return &LineError{Line: lineNo, Msg: fmt.Sprintf("missing field %q (schema has: %s)", f.Name, fieldNames(p.schema))}
		}
		v, err := decodeValue(f.Kind, raw)
		if err != nil {
			return &LineError{Line: lineNo, Field: f.Name, Msg: err.Error()}
		}
		values = append(values, v)
	}
	if len(p.raw) > p.schema.Len() {
		var unknown []string
		for name := range p.raw {
			if p.schema.Index(name) < 0 {
				unknown = append(unknown, excerpt([]byte(name)))
			}
		}
		sort.Strings(unknown)
		return &LineError{Line: lineNo, Msg: fmt.Sprintf("unknown field %s (schema has: %s)", strings.Join(unknown, ", "), fieldNames(p.schema))}
	}
	t.Values = values
	t.STime = 0
	if p.stimeAt >= 0 {
		t.STime = values[p.stimeAt].I
	}
	return nil
}

func fieldNames(s *tuple.Schema) string {
	names := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		names[i] = f.Name
	}
	return strings.Join(names, ", ")
}

func decodeValue(k tuple.Kind, raw json.RawMessage) (tuple.Value, error) {
	want := func() error { return fmt.Errorf("want %s, got %s", k, describe(raw)) }
	switch k {
	case tuple.KindInt:
		if !isNumber(raw) {
			return tuple.Value{}, want()
		}
		i, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			return tuple.Value{}, want()
		}
		return tuple.Int(i), nil
	case tuple.KindFloat:
		if !isNumber(raw) {
			return tuple.Value{}, want()
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return tuple.Value{}, want()
		}
		return tuple.Float(f), nil
	case tuple.KindBool:
		switch string(raw) {
		case "true":
			return tuple.Bool(true), nil
		case "false":
			return tuple.Bool(false), nil
		}
		return tuple.Value{}, want()
	case tuple.KindString:
		s, ok := jsonString(raw)
		if !ok {
			return tuple.Value{}, want()
		}
		return tuple.Str(s), nil
	case tuple.KindBytes:
		s, ok := jsonString(raw)
		if !ok {
			return tuple.Value{}, fmt.Errorf("want bytes (a base64 string), got %s", describe(raw))
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return tuple.Value{}, fmt.Errorf("want bytes (a base64 string), got %s", describe(raw))
		}
		return tuple.Bytes(b), nil
	case tuple.KindTimestamp:
		if s, ok := jsonString(raw); ok {
			ts, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return tuple.Value{}, fmt.Errorf("want timestamp (RFC 3339 or integer nanoseconds), got %s", describe(raw))
			}
			return tuple.Timestamp(ts.UnixNano()), nil
		}
		if isNumber(raw) {
			if ns, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
				return tuple.Timestamp(ns), nil
			}
		}
		return tuple.Value{}, fmt.Errorf("want timestamp (RFC 3339 or integer nanoseconds), got %s", describe(raw))
	}
	return tuple.Value{}, fmt.Errorf("unsupported field kind %s", k)
}

func isNumber(raw []byte) bool {
	return len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'))
}

func jsonString(raw []byte) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// describe names a JSON value's type and shows it briefly: string "x",
// number 1.5, bool true, null, object, array. What it shows of the input
// is escaped and short (see excerpt), never raw.
func describe(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		s, _ := jsonString(raw)
		return "string " + excerpt([]byte(s))
	case 't', 'f':
		return "bool " + plain(raw)
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	if isNumber(raw) {
		return "number " + plain(raw)
	}
	return excerpt(raw)
}

// plain shows a short token of printable ASCII as it is (number 1.5) and
// anything else as an excerpt.
func plain(raw []byte) string {
	if len(raw) > excerptLen {
		return excerpt(raw)
	}
	for _, c := range raw {
		if c < 0x20 || c > 0x7e {
			return excerpt(raw)
		}
	}
	return string(raw)
}

// excerptLen is how many bytes of the input an error message shows.
const excerptLen = 40

// excerpt quotes the first excerptLen bytes of b Go-style (invalid UTF-8
// and control bytes escaped, so the result is valid UTF-8 and one line),
// with "..." when b is longer.
func excerpt(b []byte) string {
	if len(b) <= excerptLen {
		return strconv.Quote(string(b))
	}
	cut := excerptLen
	// Do not split a valid multi-byte character.
	for i := 0; i < utf8.UTFMax && cut-i > 0; i++ {
		if utf8.RuneStart(b[cut-i]) {
			if r, n := utf8.DecodeRune(b[cut-i:]); r != utf8.RuneError && cut-i+n > cut {
				cut -= i
			}
			break
		}
	}
	return strconv.Quote(string(b[:cut])) + "..."
}
