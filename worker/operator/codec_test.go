package operator

import (
	"bytes"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestKeyEncoding: string keys escape every zero byte (checked against a
// byte-by-byte reference), decode back to the values, and sort like the
// values.
func TestKeyEncoding(t *testing.T) {
	reference := func(s string) []byte {
		b := []byte{byte(tuple.KindString)}
		for i := 0; i < len(s); i++ {
			b = append(b, s[i])
			if s[i] == 0 {
				b = append(b, 0xFF)
			}
		}
		return append(b, 0x00, 0x01)
	}
	strs := []string{"", "a", "\x00", "a\x00", "\x00a", "a\x00b\x00\x00c", strings.Repeat("x", 300), "ab", "a\x01", "b"}
	for _, s := range strs {
		got := appendKeyValue([]byte("pre"), tuple.Str(s))
		if want := append([]byte("pre"), reference(s)...); !bytes.Equal(got, want) {
			t.Fatalf("%q: key % x, want % x", s, got, want)
		}
		vals, err := decodeKey(string(got[3:]), 1)
		if err != nil || len(vals) != 1 || vals[0].S != s {
			t.Fatalf("%q: decodes to %v (%v)", s, vals, err)
		}
	}
	// Pairs of values: the keys sort as the pairs do.
	var pairs [][2]string
	for _, a := range strs {
		for _, b := range strs {
			pairs = append(pairs, [2]string{a, b})
		}
	}
	key := func(p [2]string) string {
		return string(appendKeyValue(appendKeyValue(nil, tuple.Str(p[0])), tuple.Str(p[1])))
	}
	byKey := append([][2]string(nil), pairs...)
	sort.Slice(byKey, func(i, j int) bool { return key(byKey[i]) < key(byKey[j]) })
	byValue := append([][2]string(nil), pairs...)
	sort.Slice(byValue, func(i, j int) bool {
		if byValue[i][0] != byValue[j][0] {
			return byValue[i][0] < byValue[j][0]
		}
		return byValue[i][1] < byValue[j][1]
	})
	if !reflect.DeepEqual(byKey, byValue) {
		t.Fatal("keys of string pairs do not sort like the pairs")
	}
}
