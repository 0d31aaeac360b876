package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSnapshotCoversEveryTable(t *testing.T) {
	covered := map[string]bool{}
	for _, k := range snapshotKinds {
		covered[k.table] = true
	}
	for table := range stateSchema().Tables {
		if !covered[table] {
			t.Errorf("table %s is not written to snapshots", table)
		}
	}
}

// reseal recomputes the end record of a snapshot whose record lines were
// edited, so the test reaches the checks behind the digest.
func reseal(t *testing.T, lines [][]byte) []byte {
	t.Helper()
	var out bytes.Buffer
	digest := sha256.New()
	for _, l := range lines[:len(lines)-1] {
		out.Write(l)
		out.WriteByte('\n')
		digest.Write(l)
		digest.Write([]byte{'\n'})
	}
	data, _ := json.Marshal(snapshotTrailer{Records: len(lines) - 2, SHA256: hex.EncodeToString(digest.Sum(nil))})
	end, _ := json.Marshal(snapshotLine{Kind: kindEnd, Data: data})
	out.Write(end)
	out.WriteByte('\n')
	return out.Bytes()
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	src := assignFixture(t)
	src.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "e", Addr: "e:1"}, IdempotencyKey: "k"})
	good := snapshotBytes(t, src.fsm)
	lines := bytes.Split(bytes.TrimSuffix(good, []byte{'\n'}), []byte{'\n'})
	if len(lines) < 5 {
		t.Fatalf("snapshot too small: %d lines", len(lines))
	}
	edit := func(f func(lines [][]byte) [][]byte) [][]byte {
		cp := make([][]byte, len(lines))
		for i, l := range lines {
			cp[i] = append([]byte(nil), l...)
		}
		return f(cp)
	}
	joined := func(ls [][]byte) []byte { return append(bytes.Join(ls, []byte{'\n'}), '\n') }

	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty stream", nil, "no end record"},
		{"truncated mid-line", good[:len(good)/2], "no newline"},
		{"truncated at a line boundary", joined(lines[:len(lines)-1]), "no end record"},
		{"record dropped", joined(edit(func(l [][]byte) [][]byte { return append(l[:2], l[3:]...) })), "end record counts"},
		{"value altered", bytes.Replace(good, []byte(`"addr":"a:7000"`), []byte(`"addr":"a:7009"`), 1), "sha256 mismatch"},
		{"not json", joined(edit(func(l [][]byte) [][]byte { l[2] = []byte("{oops"); return l })), "line 3"},
		{"unknown record kind", reseal(t, edit(func(l [][]byte) [][]byte {
			l[2] = bytes.Replace(l[2], []byte(`"kind":"worker"`), []byte(`"kind":"gizmo"`), 1)
			return l
		})), `unknown record kind "gizmo"`},
		{"duplicate record", reseal(t, edit(func(l [][]byte) [][]byte {
			return append(l[:3], l[2:]...)
		})), "duplicate primary key"},
		{"newer version", reseal(t, edit(func(l [][]byte) [][]byte {
			l[0] = bytes.Replace(l[0], []byte(`"version":1`), []byte(`"version":2`), 1)
			return l
		})), "version 2"},
		{"missing header", reseal(t, edit(func(l [][]byte) [][]byte { return l[1:] })), "want \"header\""},
		{"data after end", append(append([]byte(nil), good...), "{}\n"...), "after end record"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.registerWorker("keep", "k:1")
			before := dump(t, h.state())
			err := restoreBytes(h.fsm, tc.data)
			if !errors.Is(err, ErrCorruptSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore error = %v, want ErrCorruptSnapshot mentioning %q", err, tc.want)
			}
			requireSameState(t, before, dump(t, h.state()))
		})
	}

	// A record with a field this build does not know (written by a newer
	// build) restores to the same state: the field is ignored.
	h0 := newHarness(t)
	withField := reseal(t, edit(func(l [][]byte) [][]byte {
		for i := 1; i < len(l)-1; i++ {
			l[i] = bytes.Replace(l[i], []byte(`"data":{`), []byte(`"data":{"colour":"red",`), 1)
		}
		return l
	}))
	if !bytes.Contains(withField, []byte("colour")) {
		t.Fatal("test edit did not apply")
	}
	if err := restoreBytes(h0.fsm, withField); err != nil {
		t.Fatalf("snapshot with unknown record fields: %v", err)
	}
	requireSameState(t, dump(t, src.state()), dump(t, h0.state()))

	// The unedited snapshot restores (the edits above are what break it).
	h := newHarness(t)
	if err := restoreBytes(h.fsm, reseal(t, lines)); err != nil {
		t.Fatalf("resealed good snapshot: %v", err)
	}
	requireSameState(t, dump(t, src.state()), dump(t, h.state()))
}
