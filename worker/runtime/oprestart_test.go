package runtime

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRestartedOperatorSaysItIsBehind: an operator copy placed again
// without a snapshot (generation 2, its worker lost, no replica to
// bootstrap from) numbers its results from 1 again, while its consumer
// resumes after the results it took from the lost copy: it gets nothing
// until the new copy has produced more. That wait has no bound of its
// own (the new copy replays only what its upstreams still buffer), so the
// copy's status says so, with the consumer's position and its own, while
// it lasts. Fails without restartedBehind: the copy is plainly running.
func TestRestartedOperatorSaysItIsBehind(t *testing.T) {
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
	waitUntil(t, "the aggregate produced results its sink took", func() bool {
		st := old.Stats()
		return st.LastID > 20 && st.LaggardAck == st.LastID
	})
	// Almost nothing more comes in, and the lost copy takes what its
	// upstream holds for it (the new copy replays only what it does not
	// acknowledge, too little to catch up), its sink all it produced.
	if err := pace.Set(0.001); err != nil {
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
	var msg string
	waitUntilOr(t, "the new copy's status says its consumer waits", func() bool {
		msg = again.State().Message
		return strings.Contains(msg, "results of the lost copy and gets none of this copy's")
	}, func() { t.Logf("new copy: %+v", again.State()) })
	// The consumer resumed after what it received, which its
	// acknowledgements may trail: at least what it acknowledged.
	var holds, produced uint64
	if i := strings.Index(msg, " holds "); i < 0 {
		t.Fatalf("message %q does not say what the consumer holds", msg)
	} else if _, err := fmt.Sscanf(msg[i:], " holds %d results", &holds); err != nil || holds < held {
		t.Errorf("message %q: the consumer holds %d results, want at least the %d it acknowledged (%v)", msg, holds, held, err)
	}
	if i := strings.Index(msg, "more ("); i < 0 {
		t.Errorf("message %q does not say what the new copy produced", msg)
	} else if _, err := fmt.Sscanf(msg[i:], "more (%d so far", &produced); err != nil || produced >= holds {
		t.Errorf("message %q: produced %d, holds %d (%v)", msg, produced, holds, err)
	}
	if !strings.Contains(msg, "consumer out[0]") {
		t.Errorf("message %q does not name the consumer", msg)
	}
	if err := pace.Set(200); err != nil { // the rest of the input at once
		t.Fatal(err)
	}
}
