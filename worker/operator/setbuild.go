package operator

// Building restored count_distinct sets beside the decoding. Restoring an
// aggregate's state is one pass over its bytes, and when they come off a
// connection (RestoreStream) that pass paces the transfer: the sending
// worker waits for the receiver to read. For a count_distinct state most
// of the pass was building the sets (`bench move`, 64 MB: 6,259 sets of
// 66,300 members, one map each, about 6 MB of new maps written into
// memory the process had never touched, whose page faults cost more than
// the rest of the decoding). So restore decodes each window's members
// into a list and hands the sets of a few windows at a time to a builder
// goroutine, which makes the maps while the decoding goes on with the
// next windows' bytes:
// the two run on two cores where there are two, and the decoding, which
// the transfer waits for, no longer does the maps' work.
//
// Invariants: a set is handed over once its window is decoded, and the
// decoding never touches it again; restore waits for the builder before
// the state is used or the restore fails, so nothing reads a set while it
// is built and the goroutine never outlives the restore.

// inlineSets, set by tests and benchmarks only, makes restore build each
// set as it decodes it, as it did before the builder: the two must
// restore the same state.
var inlineSets bool

// pendingSet is a count_distinct accumulator whose n members follow
// those of the sets before it in their batch's members.
type pendingSet struct {
	acc *accumulator
	n   int
}

// setBatch is the count_distinct sets of whole windows, decoded but not
// yet built.
type setBatch struct {
	sets    []pendingSet
	members []string
}

// setBuilderBatches is how many batches go round between the decoding and
// the builder: one filling, one building, one waiting. The decoding waits
// for a free one when the builder is behind, so the members decoded ahead
// stay bounded by a few batches'.
const setBuilderBatches = 3

// setBuilder builds the sets of the batches handed to it on a goroutine
// of its own (see above).
type setBuilder struct {
	todo chan *setBatch
	free chan *setBatch
	done chan struct{}
	cur  *setBatch
}

func newSetBuilder() *setBuilder {
	b := &setBuilder{todo: make(chan *setBatch, setBuilderBatches), free: make(chan *setBatch, setBuilderBatches), done: make(chan struct{})}
	for range setBuilderBatches - 1 {
		b.free <- &setBatch{}
	}
	b.cur = &setBatch{}
	go b.run()
	return b
}

func (b *setBuilder) run() {
	defer close(b.done)
	for batch := range b.todo {
		off := 0
		for _, p := range batch.sets {
			m := make(map[string]struct{}, setRoom(p.n))
			for _, s := range batch.members[off : off+p.n] {
				m[s] = struct{}{}
			}
			p.acc.distinct = m
			off += p.n
		}
		clear(batch.members) // hold no strings of the state
		batch.sets, batch.members = batch.sets[:0], batch.members[:0]
		b.free <- batch
	}
}

// add records a set of n members; the caller appends them to
// b.cur.members.
func (b *setBuilder) add(acc *accumulator, n int) {
	b.cur.sets = append(b.cur.sets, pendingSet{acc: acc, n: n})
}

// setBatchMembers is how many members a batch collects before it is
// handed over (at the end of a window): a hand-over wakes the builder,
// and one per window (400 for bench move's state) kept the Go scheduler
// spinning between the two goroutines for a tenth more CPU. A variable
// for tests only.
var setBatchMembers = 4096

// windowDone hands the sets recorded so far to the builder once they hold
// setBatchMembers members.
func (b *setBuilder) windowDone() {
	if len(b.cur.members) >= setBatchMembers {
		b.flush()
	}
}

// flush hands the sets recorded so far to the builder.
func (b *setBuilder) flush() {
	if len(b.cur.sets) == 0 {
		return
	}
	b.todo <- b.cur
	b.cur = <-b.free
}

// wait flushes and returns once every set handed over is built and the
// builder's goroutine has ended. Call it once, on every path.
func (b *setBuilder) wait() {
	b.flush()
	close(b.todo)
	<-b.done
}

// endSets waits for d's set builder, if it has one, and drops it.
func (d *decoder) endSets() {
	if d.sets != nil {
		d.sets.wait()
		d.sets = nil
	}
}

// setRoom is the room a restored set of n members is made with: room to
// grow, because a restored task goes on adding members (a moved copy
// catching up adds to every open window at once), and a set made for
// exactly n would soon grow, rehashing every member
// (BenchmarkProcessAfterRestore: a third more CPU for a moved copy's
// first 200 ms of input). A quarter more, not a quarter and 8 more: the 8
// made every set a table (no set fits Go's small map of 8 members) and
// doubled most sets' table for nothing; in a process that has not held
// the state before, bench move's sets then took about 6 MB of untouched
// memory instead of about 4, and page faults are most of such a restore's
// CPU (bench move's 64 MB state restored off a stream into a heap just
// returned to the OS, then 41 records: 2,950 page faults and 72 cpu-ms
// for the restore with +8, 2,370 and 56-62 cpu-ms without; the 41 records
// cost 16-20 cpu-ms either way).
func setRoom(n int) int { return n + n/4 }
