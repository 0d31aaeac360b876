package operator

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/fedstream/fedstream/worker/tuple"
)

// trickle is a reader returning the bytes of b in pieces of random sizes
// (many of one byte), then, with failAt >= 0, an error at that offset.
type trickle struct {
	b      []byte
	pos    int
	r      *rand.Rand
	failAt int
}

func (t *trickle) Read(p []byte) (int, error) {
	if t.failAt >= 0 && t.pos >= t.failAt {
		return 0, errors.New("connection cut")
	}
	if t.pos == len(t.b) {
		return 0, io.EOF
	}
	n := 1 + t.r.IntN(7)
	if t.r.IntN(4) == 0 {
		n = 1 + t.r.IntN(300)
	}
	n = min(n, len(p), len(t.b)-t.pos)
	if t.failAt >= 0 {
		n = min(n, t.failAt-t.pos)
	}
	copy(p, t.b[t.pos:t.pos+n])
	t.pos += n
	return n, nil
}

// TestRestoreStreamEqualsRestore: every operator, alone and chained,
// restored from a stream delivering its state in small random pieces
// through a buffer smaller than some of its strings (read past the
// buffer), holds exactly the state Restore gives, and the stream is left
// right after the state (what follows it is still there to read).
func TestRestoreStreamEqualsRestore(t *testing.T) {
	forEachRestoreCase(t, 11, func(t *testing.T, rc restoreCase, r *rand.Rand) {
		const after = "what follows the state"
		for _, bufSize := range []int{16, 4096} {
			br := bufio.NewReaderSize(&trickle{b: append(bytes.Clone(rc.state), after...), r: r, failAt: -1}, bufSize)
			dst := rc.build()
			which := fmt.Sprintf("seed %d chained %v buffer %d", rc.seed, rc.chained, bufSize)
			if err := RestoreStream(dst, br, len(rc.state)); err != nil {
				t.Fatalf("%s: %v", which, err)
			}
			sameRestored(t, dst, rc.state, which+": the state restored from the stream")
			if rest, _ := io.ReadAll(br); string(rest) != after {
				t.Fatalf("%s: %q left after the state, want %q", which, rest, after)
			}
		}
	})
}

// TestRestoreStreamBrokenOff: a stream that breaks off anywhere in the
// state ends the restore with ErrStreamFailed (never success), and a
// state that arrived whole but is truncated or corrupt is ErrBadSnapshot.
func TestRestoreStreamBrokenOff(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	sc, state := slidingState(t, r)
	for cut := 0; cut < len(state); cut += 1 + len(state)/60 {
		br := bufio.NewReaderSize(&trickle{b: state, r: r, failAt: cut}, 16)
		if err := RestoreStream(mustNew(t, sc.def, sc.inputs...), br, len(state)); !errors.Is(err, ErrStreamFailed) {
			t.Fatalf("cut at %d of %d: restore returned %v, want ErrStreamFailed", cut, len(state), err)
		}
	}
	br := bufio.NewReader(bytes.NewReader(state[:len(state)-3]))
	if err := RestoreStream(mustNew(t, sc.def, sc.inputs...), br, len(state)-3); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("truncated state: %v, want ErrBadSnapshot", err)
	}
	bad := bytes.Clone(state)
	for i := len(bad) / 2; i < len(bad); i++ {
		bad[i] = 0xFF
	}
	br = bufio.NewReader(bytes.NewReader(bad))
	if err := RestoreStream(mustNew(t, sc.def, sc.inputs...), br, len(bad)); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("corrupt second half: %v, want ErrBadSnapshot", err)
	}
}

// memberState is an aggregate like `bench move`'s: count_distinct of
// long members over sliding windows, each member held by every open
// window (here 40).
func memberState(t testing.TB) (Operator, []byte, int) {
	def := aggDef("200ns", "5ns", []string{"port"}, "n=count()", "d=count_distinct(src)")
	op, err := New(def, []*tuple.Schema{connSchema})
	if err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("x", 1000)
	out := Collect()
	const records = 200
	for i := range records {
		st := int64(i)
		_ = op.Process(0, conn(st, fmt.Sprint(i)+payload, int64(i%4), 0, true), out)
		_ = op.Advance(st, out)
		out.Tuples = out.Tuples[:0]
	}
	snap, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return op, snap, records * len(payload)
}

// TestRestoreStreamInterns: restored from a stream, a state holding each
// ~1 KB member in every one of its 40 open windows keeps one copy per
// distinct member (every window's set points at the same string) and
// allocates a small fraction of the state's size; restored from a buffer
// (RestoreOwned), its members are 40 substrings of the buffer, which it
// keeps whole.
func TestRestoreStreamInterns(t *testing.T) {
	_, state, distinct := memberState(t)
	if len(state) < 10*distinct {
		t.Fatalf("state of %d bytes for %d bytes of distinct members: the test needs members held many times", len(state), distinct)
	}
	def := aggDef("200ns", "5ns", []string{"port"}, "n=count()", "d=count_distinct(src)")
	dst, err := New(def, []*tuple.Schema{connSchema})
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(bytes.NewReader(state), StreamBufferBytes)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := RestoreStream(dst, br, len(state)); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	if again, _ := dst.Snapshot(); !bytes.Equal(again, state) {
		t.Fatal("the state restored from the stream differs")
	}
	// One address per distinct member across every window's set.
	addrs := map[string]map[*byte]bool{}
	windows := 0
	for _, w := range dst.(*aggregate).windows {
		windows++
		for _, g := range w.groups {
			for m := range g.accs[1].distinct {
				if addrs[m] == nil {
					addrs[m] = map[*byte]bool{}
				}
				addrs[m][unsafe.StringData(m)] = true
			}
		}
	}
	if windows < 10 {
		t.Fatalf("%d open windows: the test needs many", windows)
	}
	for m, as := range addrs {
		if len(as) != 1 {
			t.Fatalf("member %.8q... held at %d addresses, want one", m, len(as))
		}
	}
	t.Logf("state %d bytes, distinct members %d bytes, restore allocated %d bytes", len(state), distinct, allocated)
	// Sets, groups and one copy of each member; not the state's bytes.
	if allocated > uint64(len(state))/3 {
		t.Fatalf("restoring a state of %d bytes (%d of distinct members) from the stream allocated %d bytes", len(state), distinct, allocated)
	}
}
