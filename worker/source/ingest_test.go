package source

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

func testSchema() *tuple.Schema {
	return tuple.NewSchema([]tuple.Field{
		{Name: "time", Kind: tuple.KindTimestamp},
		{Name: "src", Kind: tuple.KindString},
		{Name: "port", Kind: tuple.KindInt},
		{Name: "load", Kind: tuple.KindFloat},
		{Name: "ok", Kind: tuple.KindBool},
		{Name: "blob", Kind: tuple.KindBytes},
	})
}

func TestLineParserGood(t *testing.T) {
	p := NewLineParser(testSchema())
	for _, c := range []struct {
		line string
		want []tuple.Value
	}{
		{`{"time":"2024-01-01T00:00:01Z","src":"a","port":80,"load":0.5,"ok":true,"blob":"aGk="}`,
			[]tuple.Value{tuple.Timestamp(1704067201_000_000_000), tuple.Str("a"), tuple.Int(80), tuple.Float(0.5), tuple.Bool(true), tuple.Bytes([]byte("hi"))}},
		{` {"blob":"","ok":false,"load":3,"port":-1,"src":"é\n","time":12345} `,
			[]tuple.Value{tuple.Timestamp(12345), tuple.Str("é\n"), tuple.Int(-1), tuple.Float(3), tuple.Bool(false), tuple.Bytes(nil)}},
		{`{"time":"2024-01-01T01:00:00.5+01:00","src":"","port":9223372036854775807,"load":-1e3,"ok":true,"blob":""}`,
			[]tuple.Value{tuple.Timestamp(1704067200_500_000_000), tuple.Str(""), tuple.Int(9223372036854775807), tuple.Float(-1000), tuple.Bool(true), tuple.Bytes(nil)}},
	} {
		var tp tuple.Tuple
		if err := p.Parse(1, []byte(c.line), &tp); err != nil {
			t.Errorf("%s: %v", c.line, err)
			continue
		}
		if !reflect.DeepEqual(tp.Values, c.want) {
			t.Errorf("%s:\ngot  %v\nwant %v", c.line, tp.Values, c.want)
		}
		if tp.STime != c.want[0].I {
			t.Errorf("%s: stime %d, want the time field %d", c.line, tp.STime, c.want[0].I)
		}
	}
}

func TestLineParserBad(t *testing.T) {
	p := NewLineParser(testSchema())
	const good = `"time":1,"src":"a","port":80,"load":0.5,"ok":true,"blob":""`
	for _, c := range []struct{ line, want string }{
		{`{"time":1,"src":"a","port":"x","load":0.5,"ok":true,"blob":""}`, `line 7: field "port": want int, got string "x"`},
		{`{"time":1,"src":"a","port":1.5,"load":0.5,"ok":true,"blob":""}`, `line 7: field "port": want int, got number 1.5`},
		{`{"time":1,"src":"a","port":99999999999999999999,"load":0.5,"ok":true,"blob":""}`, `field "port": want int, got number 99999999999999999999`},
		{`{"time":1,"src":5,"port":1,"load":0.5,"ok":true,"blob":""}`, `line 7: field "src": want string, got number 5`},
		{`{"time":1,"src":"a","port":1,"load":"fast","ok":true,"blob":""}`, `field "load": want float, got string "fast"`},
		{`{"time":1,"src":"a","port":1,"load":1,"ok":1,"blob":""}`, `field "ok": want bool, got number 1`},
		{`{"time":1,"src":"a","port":1,"load":1,"ok":null,"blob":""}`, `field "ok": want bool, got null`},
		{`{"time":"yesterday","src":"a","port":1,"load":1,"ok":true,"blob":""}`, `field "time": want timestamp (RFC 3339 or integer nanoseconds), got string "yesterday"`},
		{`{"time":1.5,"src":"a","port":1,"load":1,"ok":true,"blob":""}`, `field "time": want timestamp`},
		{`{"time":1,"src":"a","port":1,"load":1,"ok":true,"blob":"!!"}`, `field "blob": want bytes (a base64 string)`},
		{`{"time":1,"src":"a","port":1,"load":1,"ok":true}`, `line 7: missing field "blob" (schema has: time, src, port, load, ok, blob)`},
		{`{` + good + `,"extra":1,"another":[]}`, `line 7: unknown field "another", "extra"`},
		{`{` + good, `line 7: invalid JSON`},
		{`[1,2]`, `line 7: want a JSON object, got array`},
		{`   `, `line 7: empty line`},
		{`{"time":1,"src":{"a":1},"port":1,"load":1,"ok":true,"blob":""}`, `field "src": want string, got object`},
	} {
		var tp tuple.Tuple
		err := p.Parse(7, []byte(c.line), &tp)
		if err == nil {
			t.Errorf("%s: no error, want %q", c.line, c.want)
			continue
		}
		if !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: error does not wrap ErrBadRecord", c.line)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\ngot  %v\nwant %q", c.line, err, c.want)
		}
	}
}

func TestLineParserNoTimestamp(t *testing.T) {
	p := NewLineParser(tuple.NewSchema([]tuple.Field{{Name: "w", Kind: tuple.KindString}}))
	tp := tuple.Tuple{STime: 99}
	if err := p.Parse(1, []byte(`{"w":"x"}`), &tp); err != nil {
		t.Fatal(err)
	}
	if tp.STime != 0 {
		t.Errorf("stime %d, want 0 (stamped by the source)", tp.STime)
	}
}

// The ingest example's sample data must parse with the example's schema.
func TestIngestSample(t *testing.T) {
	dir := filepath.Join("..", "..", "examples")
	spec, err := os.ReadFile(filepath.Join(dir, "ingest.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	q, err := queryspec.Parse("ingest.yaml", spec)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := q.OutputSchema("requests")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "ingest-sample.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	p := NewLineParser(schema)
	sc := bufio.NewScanner(bytes.NewReader(data))
	var n uint64
	var prev int64
	var tp tuple.Tuple
	for sc.Scan() {
		n++
		if err := p.Parse(n, sc.Bytes(), &tp); err != nil {
			t.Fatal(err)
		}
		if tp.STime < prev {
			t.Fatalf("line %d: stime goes backwards", n)
		}
		prev = tp.STime
	}
	if n < 10 {
		t.Errorf("only %d sample lines", n)
	}
}
