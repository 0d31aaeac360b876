package kafka

import (
	"encoding/base64"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/fedstream/fedstream/worker/tuple"
)

// AppendJSON appends one JSON object holding fields idx of schema (every
// field, in order, when idx is nil) from values. The encoding is the one
// ingest lines and kafka sources read, so a sink's topic can feed another
// query: int and float as numbers (NaN and ±Inf, which JSON lacks, as the
// strings "NaN", "+Inf", "-Inf"), bool, string, timestamp as an RFC 3339
// string with nanoseconds, bytes as standard padded base64.
func AppendJSON(dst []byte, schema *tuple.Schema, values []tuple.Value, idx []int) []byte {
	dst = append(dst, '{')
	field := func(n, i int) {
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, schema.Fields[i].Name)
		dst = append(dst, ':')
		if i < len(values) {
			dst = appendValue(dst, values[i])
		} else {
			dst = append(dst, "null"...)
		}
	}
	if idx == nil {
		for i := range schema.Fields {
			field(i, i)
		}
	} else {
		for n, i := range idx {
			field(n, i)
		}
	}
	return append(dst, '}')
}

func appendValue(dst []byte, v tuple.Value) []byte {
	switch v.Kind {
	case tuple.KindInt:
		return strconv.AppendInt(dst, v.I, 10)
	case tuple.KindFloat:
		switch {
		case math.IsNaN(v.F):
			return append(dst, `"NaN"`...)
		case math.IsInf(v.F, 1):
			return append(dst, `"+Inf"`...)
		case math.IsInf(v.F, -1):
			return append(dst, `"-Inf"`...)
		}
		return strconv.AppendFloat(dst, v.F, 'g', -1, 64)
	case tuple.KindBool:
		return strconv.AppendBool(dst, v.I != 0)
	case tuple.KindTimestamp:
		return appendString(dst, time.Unix(0, v.I).UTC().Format(time.RFC3339Nano))
	case tuple.KindBytes:
		return appendString(dst, base64.StdEncoding.EncodeToString([]byte(v.S)))
	case tuple.KindString:
		return appendString(dst, v.S)
	}
	return append(dst, "null"...)
}

// appendString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, "\ufffd"...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}
