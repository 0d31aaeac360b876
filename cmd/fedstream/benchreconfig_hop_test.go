package main

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The hop baseline samples both messages and stops cleanly: every
// goroutine it started has ended when stop returns.
func TestHopBaselineSamplesBothMessages(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h, err := startHopBaseline(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.mu.Lock()
		n := min(len(h.oneWay), len(h.rtt))
		h.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d samples after 20 s", n)
		}
		time.Sleep(hopEvery)
	}
	b, err := h.stop()
	if err != nil {
		t.Fatal(err)
	}
	if b.Samples < 3 || b.TCPOneWayMsP50 <= 0 || b.GRPCRoundTripMsP50 <= 0 {
		t.Fatalf("baseline %+v: want 3 samples or more, each figure above 0", b)
	}
}
