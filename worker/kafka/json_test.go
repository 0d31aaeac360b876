package kafka

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// A sink's JSON values read back as ingest lines (and so by a kafka
// source) with the same values: the encodings agree.
func TestAppendJSONReadsBack(t *testing.T) {
	schema := tuple.NewSchema([]tuple.Field{
		{Name: "time", Kind: tuple.KindTimestamp}, {Name: "s", Kind: tuple.KindString},
		{Name: "i", Kind: tuple.KindInt}, {Name: "f", Kind: tuple.KindFloat},
		{Name: "b", Kind: tuple.KindBool}, {Name: "raw", Kind: tuple.KindBytes},
	})
	values := []tuple.Value{
		tuple.Timestamp(1_714_564_800_123_456_789), tuple.Str("a \"quoted\"\n\tline \\ with \x01 and é"),
		tuple.Int(math.MinInt64), tuple.Float(-1.5e-300), tuple.Bool(true), tuple.Bytes([]byte{0, 255, 10}),
	}
	line := AppendJSON(nil, schema, values, nil)
	if !json.Valid(line) {
		t.Fatalf("not JSON: %s", line)
	}
	var tp tuple.Tuple
	if err := source.NewLineParser(schema).Parse(1, line, &tp); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	for i, v := range values {
		if tp.Values[i] != v {
			t.Fatalf("field %s: read back %+v, wrote %+v (%s)", schema.Fields[i].Name, tp.Values[i], v, line)
		}
	}
	if key := AppendJSON(nil, schema, values, []int{2, 1}); string(key) != `{"i":-9223372036854775808,"s":"a \"quoted\"\n\tline \\ with \u0001 and é"}` {
		t.Fatalf("key %s", key)
	}
}

// Values JSON cannot hold are strings, and invalid UTF-8 is replaced:
// the value is always valid JSON.
func TestAppendJSONSpecialValues(t *testing.T) {
	schema := tuple.NewSchema([]tuple.Field{{Name: "a", Kind: tuple.KindFloat}, {Name: "b", Kind: tuple.KindFloat}, {Name: "c", Kind: tuple.KindFloat}, {Name: "d", Kind: tuple.KindString}})
	line := AppendJSON(nil, schema, []tuple.Value{tuple.Float(math.NaN()), tuple.Float(math.Inf(1)), tuple.Float(math.Inf(-1)), tuple.Str("x\xffy")}, nil)
	if want := `{"a":"NaN","b":"+Inf","c":"-Inf","d":"x` + "\ufffd" + `y"}`; string(line) != want {
		t.Fatalf("got %s, want %s", line, want)
	}
	if !json.Valid(line) {
		t.Fatalf("not JSON: %s", line)
	}
}
