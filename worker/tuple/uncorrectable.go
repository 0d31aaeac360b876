package tuple

// UncorrectableMarker builds the record saying that the results with
// stream time in [from, to) could not be corrected (see Uncorrectable).
// from may be math.MinInt64: from the start of the stream.
func UncorrectableMarker(from, to int64) Tuple {
	return Tuple{Type: Uncorrectable, STime: from, Values: []Value{Timestamp(from), Timestamp(to)}}
}

// UncorrectableRange reads the range of a marker built by
// UncorrectableMarker from its decoded values; ok is false when t is not
// such a marker (another type, or values of another shape: a consumer
// then shows it without a range rather than fail).
func UncorrectableRange(t *Tuple) (from, to int64, ok bool) {
	if t.Type != Uncorrectable {
		return 0, 0, false
	}
	if t.Packed() {
		// Decoded by DecodeHeader (a sink's input keeps values packed):
		// decode a copy's values (a rare record, so the cost is no
		// matter).
		var full Tuple
		if _, err := DecodeTuple(AppendTuple(nil, t), &full); err != nil {
			return 0, 0, false
		}
		t = &full
	}
	if len(t.Values) != 2 || t.Values[0].Kind != KindTimestamp || t.Values[1].Kind != KindTimestamp {
		return 0, 0, false
	}
	return t.Values[0].I, t.Values[1].I, true
}
