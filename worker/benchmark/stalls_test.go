package benchmark

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestStallCausesOverlap(t *testing.T) {
	ms := int64(time.Millisecond)
	events := [][]stallEvent{
		{{Kind: "late", Start: 0, End: 5 * ms}, {Kind: "late", Start: 100 * ms, End: 144 * ms}, {Kind: "gc", Start: 120 * ms, End: 122 * ms}},
		{{Kind: "late", Start: 200 * ms, End: 210 * ms}},
		nil,
	}
	got := stallCauses(110*ms, 150*ms, []string{"a", "b", "c"}, events)
	if len(got) != 1 || got[0].Process != "a" || got[0].LateMs != 44 || got[0].GCPauses != 1 || got[0].GCMs != 2 {
		t.Fatalf("causes = %+v, want a: late 44 ms, one GC pause of 2 ms", got)
	}
	if got := stallCauses(300*ms, 400*ms, []string{"a", "b", "c"}, events); len(got) != 0 {
		t.Fatalf("causes outside every event = %+v, want none", got)
	}
}

func TestStallSamplerReportsGCPauses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := startStallSampler(ctx)
	defer func() { cancel(); <-s.done }()
	before := time.Now().UnixNano()
	runtime.GC()
	for _, e := range s.events() {
		if e.Kind == "gc" && e.End >= before && e.Start <= e.End {
			return
		}
	}
	t.Fatalf("no GC pause after %d in %+v", before, s.events())
}

func TestFlightRecordingWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.trace")
	if err := writeFlightRecording(nil, path); err == nil {
		t.Fatal("a worker without a flight recorder wrote a trace")
	}
	fr, err := startFlightRecorder()
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Stop()
	runtime.GC() // something to record
	if err := writeFlightRecording(fr, path); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() == 0 {
		t.Fatalf("trace file: %v, %v", st, err)
	}
}
