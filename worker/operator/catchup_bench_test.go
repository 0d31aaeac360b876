package operator

import (
	"bufio"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// BenchmarkProcessAfterRestore: the first input an aggregate processes
// after it was restored from a snapshot (a moved task catching up), with
// the state of `bench move` (count_distinct of 1 KB members over 400
// sliding windows, 16 groups), against the same input into the state
// that was never snapshotted.
func BenchmarkProcessAfterRestore(b *testing.B) {
	def := aggDef("2s", "5ms", []string{"port"}, "n=count()", "d=count_distinct(src)")
	const rate = 165 // records per second, as bench move at 64 MB
	payload := strings.Repeat("x", 1000)
	rec := func(i int) *tuple.Tuple {
		st := int64(i) * int64(1e9) / rate
		return &tuple.Tuple{Type: tuple.Stable, STime: st, Values: []tuple.Value{tuple.Timestamp(st), tuple.Str(fmt.Sprint(i) + payload),
			tuple.Int(int64(i % 16)), tuple.Float(0), tuple.Bool(true)}}
	}
	build := func(b *testing.B) (Operator, int) {
		op, err := New(def, []*tuple.Schema{connSchema})
		if err != nil {
			b.Fatal(err)
		}
		out := Collect()
		n := 2 * rate * 2
		for i := range n {
			if err := op.Process(0, rec(i), out); err != nil {
				b.Fatal(err)
			}
			_ = op.Advance(rec(i).STime, out)
		}
		return op, n
	}
	catchUp := func(b *testing.B, op Operator, from int) {
		out := Collect()
		for i := from; i < from+33; i++ {
			_ = op.Process(0, rec(i), out)
			_ = op.Advance(rec(i).STime, out)
		}
	}
	for _, restored := range []bool{false, true} {
		b.Run(fmt.Sprintf("restored=%v", restored), func(b *testing.B) {
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				op, n := build(b)
				if restored {
					snap, _ := op.Snapshot()
					fresh, _ := New(def, []*tuple.Schema{connSchema})
					if err := RestoreOwned(fresh, snap); err != nil {
						b.Fatal(err)
					}
					op = fresh
				}
				b.StartTimer()
				before := cpuTime()
				catchUp(b, op, n)
				cpu += cpuTime() - before
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}

// cpuTime is the process's CPU time (user and system): less sensitive
// than wall time to other processes on a shared machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// minorFaults is the process's page faults that needed no I/O so far.
func minorFaults() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

// BenchmarkMoveStateCodec: encoding (WriteTransient, as a bulk transfer
// does) and restoring (RestoreOwned) the state of `bench move` at 64 MB,
// in process CPU time per MB: what a live move's transfer costs its two
// workers beyond the bytes' encryption.
func BenchmarkMoveStateCodec(b *testing.B) {
	def, op, feed := moveStateAgg(b)
	for i := range 4 * moveStateRate {
		feed(i)
	}
	snap, _ := op.Snapshot()
	mb := float64(len(snap)) / (1 << 20)
	b.Run("encode", func(b *testing.B) {
		var cpu time.Duration
		for b.Loop() {
			before := cpuTime()
			enc, _ := FreezeEncodingOf(op)()
			_ = enc.WriteTransient(func([]byte) error { return nil })
			cpu += cpuTime() - before
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		b.ReportMetric(mb, "MB")
	})
	b.Run("restore", func(b *testing.B) {
		var cpu time.Duration
		for b.Loop() {
			fresh, _ := New(def, []*tuple.Schema{connSchema})
			before := cpuTime()
			_ = RestoreOwned(fresh, snap)
			cpu += cpuTime() - before
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
	// What the receiving worker does with the bytes a TLS connection
	// hands it in records of 16 KB: written into a fresh buffer of the
	// state's size and restored owned from it (the restore while arriving
	// does the same work on two goroutines), against decoded as they are
	// read through a reused buffer with members interned (RestoreStream).
	// Each begins with the heap's free memory returned to the OS, as a
	// worker receiving a state for the first time finds it.
	b.Run("receive-buffer", func(b *testing.B) {
		var cpu time.Duration
		for b.Loop() {
			fresh, _ := New(def, []*tuple.Schema{connSchema})
			debug.FreeOSMemory()
			before := cpuTime()
			buf := make([]byte, len(snap))
			_, _ = io.CopyBuffer(&sliceWriter{b: buf}, &recordReader{b: snap}, nil)
			_ = RestoreOwned(fresh, buf)
			cpu += cpuTime() - before
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
	// receive-stream also reports the restore's wall time (the decoding
	// paces a transfer) and its page faults (what most of its CPU is in
	// a heap that has just been returned to the OS).
	b.Run("receive-stream", func(b *testing.B) {
		var cpu, wall time.Duration
		var faults int64
		for b.Loop() {
			fresh, _ := New(def, []*tuple.Schema{connSchema})
			debug.FreeOSMemory()
			f0 := minorFaults()
			before, began := cpuTime(), time.Now()
			_ = RestoreStream(fresh, bufio.NewReaderSize(&recordReader{b: snap}, StreamBufferBytes), len(snap))
			cpu += cpuTime() - before
			wall += time.Since(began)
			faults += minorFaults() - f0
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		b.ReportMetric(float64(wall.Microseconds())/1000/float64(b.N), "wall-ms/op")
		b.ReportMetric(float64(faults)/float64(b.N), "faults/op")
	})
}

// recordReader hands out b in reads of at most one TLS record (16 KB), as
// a crypto/tls connection does.
type recordReader struct {
	b   []byte
	off int
}

func (r *recordReader) Read(p []byte) (int, error) {
	if r.off == len(r.b) {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 16<<10)], r.b[r.off:])
	r.off += n
	return n, nil
}

// sliceWriter writes into b from its start.
type sliceWriter struct {
	b   []byte
	off int
}

func (w *sliceWriter) Write(p []byte) (int, error) {
	n := copy(w.b[w.off:], p)
	w.off += n
	return n, nil
}

// moveStateRate is the input rate (records per second) of bench move's
// state at 64 MB.
const moveStateRate = 165

// moveStateAgg is an aggregate of bench move's query (count_distinct of
// 1 KB members over 2 s windows sliding every 5 ms, 16 groups), its
// definition, and feed, which processes record i of the input into it
// with its window advance.
func moveStateAgg(b *testing.B) (def *queryspec.Operator, op Operator, feed func(i int)) {
	def = aggDef("2s", "5ms", []string{"port"}, "n=count()", "d=count_distinct(src)")
	payload := strings.Repeat("x", 1000)
	op, err := New(def, []*tuple.Schema{connSchema})
	if err != nil {
		b.Fatal(err)
	}
	out := Collect()
	return def, op, func(i int) {
		st := int64(i) * int64(1e9) / moveStateRate
		tp := &tuple.Tuple{Type: tuple.Stable, STime: st, Values: []tuple.Value{tuple.Timestamp(st), tuple.Str(fmt.Sprint(i) + payload),
			tuple.Int(int64(i % 16)), tuple.Float(0), tuple.Bool(true)}}
		if err := op.Process(0, tp, out); err != nil {
			b.Fatal(err)
		}
		_ = op.Advance(st, out)
		out.Tuples = out.Tuples[:0]
	}
}

// BenchmarkCountDistinctSliding: one input tuple, with its window
// advance, into the state of `bench move` in steady state (a new 1 KB
// count_distinct member added to each of 400 sliding windows), in process
// CPU time per tuple: what the old copy of a live move spends per tuple
// while it sends its state, and a moved copy while it catches up.
func BenchmarkCountDistinctSliding(b *testing.B) {
	_, _, feed := moveStateAgg(b)
	i := 0
	for ; i < 2*2*moveStateRate; i++ { // every window open and full
		feed(i)
	}
	n, before := 0, cpuTime()
	for b.Loop() {
		feed(i)
		i++
		n++
	}
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(n), "cpu-us/op")
}
