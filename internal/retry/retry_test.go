package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBackoffGrowsCapsAndResets(t *testing.T) {
	b := Policy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, Jitter: NoJitter}.New()
	want := []time.Duration{10, 20, 40, 50, 50}
	for i, w := range want {
		if got := b.Next(); got != w*time.Millisecond {
			t.Fatalf("delay %d = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	b.Reset()
	if got := b.Next(); got != 10*time.Millisecond {
		t.Fatalf("after reset: %v, want 10ms", got)
	}
}

func TestJitterStaysInRange(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: 0.5}
	b := p.New()
	varied := false
	first := b.Next()
	for i := 0; i < 200; i++ {
		d := b.Next()
		if d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("jittered delay %v outside [50ms, 100ms]", d)
		}
		if d != first {
			varied = true
		}
	}
	if !varied {
		t.Fatal("200 jittered delays were all equal")
	}
}

func TestDoStopsOnSuccessPermanentAttemptsAndContext(t *testing.T) {
	fast := Policy{Initial: time.Millisecond, Max: time.Millisecond}
	boom := errors.New("boom")

	calls := 0
	err := Do(context.Background(), fast, 0, nil, func(context.Context) error {
		calls++
		if calls < 3 {
			return boom
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("success after retries: err %v calls %d", err, calls)
	}

	calls = 0
	stop := errors.New("stop")
	err = Do(context.Background(), fast, 0, nil, func(context.Context) error { calls++; return Permanent(stop) })
	if err != stop || calls != 1 {
		t.Fatalf("permanent: err %v calls %d, want the bare error after one call", err, calls)
	}

	calls = 0
	retried := 0
	err = Do(context.Background(), fast, 4, func(int, error, time.Duration) { retried++ }, func(context.Context) error { calls++; return boom })
	if !errors.Is(err, ErrAttemptsExhausted) || !errors.Is(err, boom) || calls != 4 || retried != 3 {
		t.Fatalf("bounded: err %v calls %d retried %d", err, calls, retried)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = Do(ctx, fast, 0, nil, func(context.Context) error {
		calls++
		if calls == 2 {
			cancel()
		}
		return boom
	})
	if !errors.Is(err, context.Canceled) || calls != 2 {
		t.Fatalf("cancelled: err %v calls %d", err, calls)
	}
}
