package source

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Binary and non-UTF-8 lines are refused one by one with a short,
// escaped excerpt: error messages travel in proto3 strings, which must be
// valid UTF-8 (a raw byte echoed into one failed the whole ingest call).
func TestLineParserBinary(t *testing.T) {
	p := NewLineParser(testSchema())
	cases := []struct {
		line string
		want string
	}{
		{"\xff\xfe\x00\x01binary", `not valid UTF-8 (binary data?): "\xff\xfe\x00\x01binary"`},
		{`{"time":1,"src":"` + "\xc3\x28" + `"}`, `not valid UTF-8`},
		{"7\x01\x02", `want a JSON object, got number "7\x01\x02"`},
		{"t\x7f", `want a JSON object, got bool "t\x7f"`},
		{strings.Repeat("é", 60), `want a JSON object, got "` + strings.Repeat("é", 20) + `"...`},
	}
	for _, c := range cases {
		var tp tuple.Tuple
		err := p.Parse(3, []byte(c.line), &tp)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %s", c.line, err, c.want)
		}
	}
	// Whatever the bytes, a message is valid UTF-8, one line and short.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		b := make([]byte, 1+rng.IntN(200))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		switch i % 4 {
		case 1:
			b[0] = '{'
		case 2:
			b = append([]byte(`{"time":1,"src":"x","port":`), b...)
		case 3:
			b[0] = byte('0' + i%10)
		}
		var tp tuple.Tuple
		err := p.Parse(1, b, &tp)
		if err == nil {
			continue
		}
		msg := err.Error()
		if !utf8.ValidString(msg) || strings.ContainsAny(msg, "\n\r\x00") || len(msg) > 300 {
			t.Fatalf("%q: message %q is not valid UTF-8, or not one short line", b, msg)
		}
	}
}
