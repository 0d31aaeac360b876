package operator

// Building restored count_distinct sets beside the decoding. Restoring an
// aggregate's state is one pass over its bytes, and when they come off a
// connection (RestoreStream) that pass paces the transfer: the sending
// worker waits for the receiver to read. For a count_distinct state most
// of the pass was building the sets (`bench move`, 64 MB: 6,259 sets of
// 66,300 members, one map each, about 6 MB of new maps written into
// memory the process had never touched, whose page faults cost more than
// the rest of the decoding). So restore decodes each window's members
// into a list and hands the window's sets to a builder goroutine, which
// makes the maps while the decoding goes on with the next window's bytes:
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

// setBatch is the count_distinct sets of one window, decoded but not yet
// built.
type setBatch struct {
	sets    []pendingSet
	members []string
}

// setBuilderBatches is how many batches go round between the decoding and
// the builder: one filling, one building, one waiting. The decoding waits
// for a free one when the builder is behind, so the members decoded ahead
// stay bounded by a few windows'.
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
// first 200 ms of input).
func setRoom(n int) int { return n + n/4 + 8 }
