package runtime

import (
	"sync"
	"sync/atomic"
)

// Receiving a large snapshot into fresh memory. The buffer a snapshot's
// bytes land in is new memory of the snapshot's size, which the restored
// state keeps (its strings are substrings of it). Touching each of its
// pages for the first time costs a page fault; on a virtual machine that
// is several times the cost of copying the page's bytes (64 MiB: about
// 35 ms of faults against 7 ms of copying). The goroutine reading the
// connection would take every one of those faults between two reads,
// making it, rather than the connection, the transfer's bottleneck. So a
// prefaulter makes the pages present ahead of the reader, on a goroutine
// of its own: the faults run beside the reading instead of inside it.
// Making pages present (prefaultPages) never writes to them, so it may run
// while the reader fills them.

// prefaultMinBytes is the smallest buffer worth prefaulting, and
// prefaultStepBytes how much one step makes present.
const (
	prefaultMinBytes  = 4 << 20
	prefaultStepBytes = 1 << 20
)

// prefaultEnabled turns prefaulting on where the platform supports it
// (tests and benchmarks compare with it off).
var prefaultEnabled = prefaultSupported

// prefaulter makes a buffer's pages present ahead of a reader that fills
// it in order (done tells it how far the reader got).
type prefaulter struct {
	buf  []byte
	done atomic.Int64 // bytes the reader has filled
	stop atomic.Bool
	wg   sync.WaitGroup
}

// startPrefault starts making buf's pages present from its start (nil:
// buf is too small to be worth it, or the platform cannot). The caller
// reports progress with filled and must call end before buf is handed on.
func startPrefault(buf []byte) *prefaulter {
	if len(buf) < prefaultMinBytes || !prefaultEnabled {
		return nil
	}
	p := &prefaulter{buf: buf}
	p.wg.Add(1)
	go p.run()
	return p
}

func (p *prefaulter) run() {
	defer p.wg.Done()
	for off := 0; off < len(p.buf) && !p.stop.Load(); off += prefaultStepBytes {
		// Pages the reader has already filled are present: skip them.
		if filled := int(p.done.Load()); filled > off {
			off = filled - filled%prefaultStepBytes
			continue
		}
		if !prefaultPages(p.buf[off:min(off+prefaultStepBytes, len(p.buf))]) {
			return
		}
	}
}

// filled reports that the reader has filled buf[:n].
func (p *prefaulter) filled(n int) {
	if p != nil {
		p.done.Store(int64(n))
	}
}

// end stops the prefaulter and waits for it.
func (p *prefaulter) end() {
	if p == nil {
		return
	}
	p.stop.Store(true)
	p.wg.Wait()
}
