package runtime

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Stopping a query releases what its tasks held: a source whose output
// nobody reads fills its buffers to their bound; once the query stops,
// the runtime keeps no task, and the buffers' memory is collectable (the
// finding: workers stayed at 5.5 GB after `query stop`). goleak in
// TestMain checks the tasks' goroutines ended.
func TestStoppedTasksReleaseBuffers(t *testing.T) {
	pool := dataplane.NewPool()
	defer pool.Close()
	w := startWorker(t, pool)
	defer w.close(t)
	const bound = 64 << 20
	w.rt.opts.Buffer = dataplane.BufferOptions{MaxBytes: bound, MaxTuples: 1 << 30}
	q, err := queryspec.Parse("q.yaml", []byte(`
name: big
sources:
  - {name: blobs, generator: {kind: blob, size: 60000, seed: 1}}
sinks:
  - {name: out, input: blobs}
`))
	if err != nil {
		t.Fatal(err)
	}
	base := heapInUse()
	id := "big/blobs/p0/r0"
	w.rt.Apply(context.Background(), []TaskSpec{{TaskID: id, Query: "big", Fragment: "blobs", QueryIndex: 1, Spec: q}})
	waitUntil(t, "the source blocked on full buffers", func() bool {
		for _, o := range w.rt.task(id).outs {
			if o.buf.Stats().BlockedAppends > 0 {
				return true
			}
		}
		return false
	})
	held := heapInUse()
	if held < base+bound/4 {
		t.Fatalf("heap grew by %d bytes only; the test needs full buffers", held-base)
	}
	start := time.Now()
	w.rt.Apply(context.Background(), nil)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stopping took %v", d)
	}
	if st := w.rt.States(); len(st) != 0 {
		t.Fatalf("tasks after stop: %+v", st)
	}
	if after := heapInUse(); after > base+bound/8 {
		t.Fatalf("heap after stop is %d MiB above the start (%d MiB while running): the stopped task's buffers are still referenced",
			(after-base)>>20, (held-base)>>20)
	}
}
