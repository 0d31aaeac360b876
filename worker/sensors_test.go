package worker

import (
	"testing"
	"time"

	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// TestSensorWindowsQueueUntilDelivered: every closed window is carried by
// the heartbeats until one gets through (a failed heartbeat loses none),
// then only the latest is sent again until the next closes; at most
// maxSensorRounds wait, the oldest dropped first; each window carries the
// key slots sampled during it and the nominal window length.
func TestSensorWindowsQueueUntilDelivered(t *testing.T) {
	s := newSensors(time.Second)
	at := func(sec int64) time.Time { return time.Unix(1000+sec, 0) }
	reading := func(in uint64) []wrt.TaskStats {
		return []wrt.TaskStats{{TaskID: "q/f/p0/r0", Generation: 1, InTuples: in, BusyNanos: int64(in) * 1e6}}
	}
	s.close("w1", reading(0), nil, at(0)) // first reading: no window yet
	if got, n := s.report(); len(got) != 0 || n != 1 {
		t.Fatalf("report before a window closed: %v (%d rounds), want one empty round", got, n)
	}
	s.delivered(1)
	s.close("w1", reading(100), []wrt.KeySamples{{TaskID: "q/f/p0/r0", Top: []wrt.KeySample{{Fragment: "g", Slot: 7, Count: 3}}, Sampled: map[string]uint64{"g": 5}}}, at(1))
	s.close("w1", reading(300), nil, at(2))
	got, n := s.report()
	if n != 2 || len(got) != 2 || got[0].InTps != 100 || got[1].InTps != 200 || got[0].WindowMs != 1000 || got[1].Busy != 0.2 {
		t.Fatalf("report of two windows: %v (%d rounds)", got, n)
	}
	if len(got[0].KeySample) != 1 || got[0].KeySample[0].Slot != 7 || got[0].KeysSampled != 5 || len(got[1].KeySample) != 0 {
		t.Fatalf("key samples: %v / %v", got[0], got[1])
	}
	// The heartbeat failed: the next carries both again, and the window
	// closed meanwhile.
	s.close("w1", reading(600), nil, at(3))
	if got, n = s.report(); n != 3 || len(got) != 3 || got[2].InTps != 300 {
		t.Fatalf("report after a failed heartbeat: %v (%d rounds)", got, n)
	}
	s.delivered(n)
	if got, n = s.report(); n != 0 || len(got) != 1 || got[0].InTps != 300 {
		t.Fatalf("report with nothing new: %v (%d rounds), want the latest window again", got, n)
	}
	for sec := int64(4); sec < 4+2*maxSensorRounds; sec++ {
		s.close("w1", reading(uint64(600+sec*10)), nil, at(sec))
	}
	if got, n = s.report(); n != maxSensorRounds || got[len(got)-1].ReportedAtMs != at(3+2*maxSensorRounds).UnixMilli() {
		t.Fatalf("%d rounds waiting, want the newest %d", n, maxSensorRounds)
	}
	select {
	case <-s.closed:
	default:
		t.Fatal("closing a window did not wake the heartbeat")
	}
}
