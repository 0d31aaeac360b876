package runtime

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRestartedOperatorContinuesAfterItsConsumer: an operator copy placed
// again without a snapshot (generation 2, its worker lost, no replica to
// bootstrap from) continues its output's ids after the position its
// consumer resumed at, so the consumer takes the copy's results as they
// come. Numbered from 1 again, they all fell at or below that position
// and the consumer got none of them until the copy had produced as many
// results as the lost one: a wait as long as the lost copy had run.
// Fails before alignRestartedOutputs: the consumer's first
// acknowledgement past its position comes only once the copy has
// produced more results than the lost one had.
func TestRestartedOperatorContinuesAfterItsConsumer(t *testing.T) {
	const rate = 100
	q := mustParse(t, fmt.Sprintf(wordsQuery, 1, rate))
	const counts = "wc/counts/p0/r0"
	place := func(node string, partition, _ int) int {
		if node == "counts" && partition == 0 {
			return 0
		}
		return 1
	}
	pace, err := NewPace(20) // 2000 records a second at first
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterEach(t, q, place,
		Options{BoundaryInterval: time.Millisecond},
		Options{BoundaryInterval: time.Millisecond, SourcePace: pace},
		Options{BoundaryInterval: time.Millisecond})
	defer c.close(t)
	c.apply()
	lost, next := c.workers[0], c.workers[2]
	first := lost.rt.task(counts)
	if first == nil {
		t.Fatal("the aggregate did not start")
	}
	old := first.outs[0].buf
	// Many results, so that the new copy producing as many takes long
	// against the few it needs before its consumer takes one.
	const many = 400
	waitUntil(t, "the aggregate produced results its sink took", func() bool {
		st := old.Stats()
		return st.LastID > many && st.LaggardAck == st.LastID
	})
	// Almost nothing more comes in, and the lost copy takes what its
	// upstream holds for it (the new copy replays only what it does not
	// acknowledge), its sink all it produced.
	if err := pace.Set(0.05); err != nil { // 5 records a second: its next one comes soon after a change of pace
		t.Fatal(err)
	}
	src := c.workers[1].rt.task("wc/lines/p0/r0")
	if src == nil {
		t.Fatal("the source does not run on worker 1")
	}
	waitUntil(t, "the aggregate took its input and its sink took its results", func() bool {
		for _, o := range append(append([]*outStream(nil), src.outs...), first.outs...) {
			if st := o.buf.Stats(); st.LaggardAck != st.LastID {
				return false
			}
		}
		return true
	})
	spec := c.loseWorker(lost, counts)
	held := old.Stats().LaggardAck
	again := c.placeAgainFromNothing(t, lost, spec, next)
	if again.aligned == nil {
		t.Fatal("the new copy does not align its output with its consumer")
	}
	select {
	case <-again.aligned:
	case <-time.After(time.Minute):
		t.Fatal("the new copy did not align its output within a minute")
	}
	// The consumer resumed after what it received, which its
	// acknowledgements may trail: at least what it acknowledged.
	out := again.outs[0]
	from := out.buf.Stats().LastID
	if from < held {
		t.Fatalf("the new copy numbers its output after %d, below the %d results its consumer acknowledged", from, held)
	}
	if err := pace.Set(1); err != nil { // 100 records a second again
		t.Fatal(err)
	}
	var st dataplaneStats
	waitUntilOr(t, "the consumer took a result of the new copy", func() bool {
		s := out.buf.Stats()
		st = dataplaneStats{last: s.LastID, ack: s.LaggardAck}
		return s.LaggardAck > from
	}, func() { t.Logf("new copy: %+v, output %+v", again.State(), out.buf.Stats()) })
	if produced := st.last - from; produced >= held {
		t.Errorf("the consumer took the new copy's first result only after it had produced %d, as many as the lost copy's %d", produced, held)
	}
	if msg := again.State().Message; strings.Contains(msg, "gets none of this copy's") {
		t.Errorf("status says the consumer waits although it takes the copy's results: %q", msg)
	}
	if err := pace.Set(200); err != nil { // the rest of the input at once
		t.Fatal(err)
	}
}

// dataplaneStats is what the test reads of an output buffer.
type dataplaneStats struct{ last, ack uint64 }
