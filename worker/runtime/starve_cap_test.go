package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dcaa"
)

// A worker process starved again and again (its failure detector's
// timer late by more than half a detection timeout every second or so)
// listens afresh each time, but an input whose replica stays silent is
// still failed once its wall silence passes starveLimit. Before, listening afresh restarted the wall silence too, so
// under sustained load a partitioned replica was never taken for failed.
func TestStarvedProcessStillDetectsASilentInputWithinTheCap(t *testing.T) {
	const detect = 200 * time.Millisecond
	r := &Runtime{opts: Options{DetectTimeout: detect}}
	in := &input{t: &task{r: r}}
	start := time.Now().UnixNano()
	in.hear(start)
	// The process is starved all the time (the starvation clock runs
	// with the wall clock), and the detector's timer runs late every
	// second; nothing is heard from the replica.
	now := start
	end := start + starveLimit(detect) + int64(2*detect)
	for ; now < end; now += int64(100 * time.Millisecond) {
		r.starve().note(now, int64(100*time.Millisecond))
		if (now-start)%int64(time.Second) == 0 {
			in.listenAfresh(now)
		}
	}
	if s := in.silence(now); s <= int64(detect) {
		t.Fatalf("after %v of wall silence the input counts %v silent (detection timeout %v, limit %v): never failed",
			time.Duration(now-start), time.Duration(s), detect, time.Duration(starveLimit(detect)))
	}
	// Listening afresh still forgives what the process could not hear
	// while it stood still, within the cap.
	in.hear(now)
	in.listenAfresh(now + int64(detect))
	if s := in.silence(now + int64(detect) + int64(detect)/2); s > int64(detect) {
		t.Fatalf("just after listening afresh the input counts %v silent, want at most %v", time.Duration(s), detect)
	}
}

// An input that has heard no replica of its upstream since its task
// started is allowed dcaa.StartGrace of silence before the
// watchdog moves it (its upstream may start a little later, under load
// well past one detection timeout); once it heard one, one timeout.
// Before, a consumer took an upstream replica that had not sent its
// first heartbeat yet for failed after one timeout.
func TestWatchdogGivesAnUpstreamTimeToStart(t *testing.T) {
	const detect = 200 * time.Millisecond
	r := &Runtime{opts: Options{DetectTimeout: detect}}
	in := &input{t: &task{r: r}}
	start := time.Now().UnixNano()
	in.hear(start)
	now := start + int64(3*detect)
	if s, limit := in.silence(now), in.silenceLimit(detect); s > limit {
		t.Fatalf("%v after the start, nothing heard yet: silence %v past the limit %v: taken for failed before its upstream could start",
			time.Duration(now-start), time.Duration(s), time.Duration(limit))
	}
	in.heardFrom(0, 0, true)
	if limit := in.silenceLimit(detect); limit != int64(detect) {
		t.Fatalf("once a replica was heard, the limit is %v, want the detection timeout %v", time.Duration(limit), detect)
	}
}

// An operator task of a replicated query whose share of X leaves room
// for a stretched detection in its half fails a silent input by half its
// share of wall time however starved its process is, so that the switch
// to another replica has the other half: at load 22, with starveLimit
// alone, a held replica was taken for failed 3.7 s into a 5 s share and
// the input caught up too late. A smaller share keeps starveLimit.
func TestStarveCapLeavesHalfTheShareForTheSwitch(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct{ detect, share, want time.Duration }{
		{400 * ms, 4 * time.Second, 2 * time.Second},                      // just room: DetectMax 1.6 s + 400 ms
		{400 * ms, 3 * time.Second, time.Duration(starveLimit(400 * ms))}, // DetectMax 1.5 s + 400 ms > 1.5 s
		{400 * ms, 5 * time.Second, 2500 * ms},                            // TestDCAAOneReplicaLostNoTentative
		{100 * ms, 300 * ms, time.Duration(starveLimit(100 * ms))},        // no room: starveLimit
		{400 * ms, 0, time.Duration(starveLimit(400 * ms))},               // max_delay 0
		{500 * ms, dcaa.Strict, time.Duration(starveLimit(500 * ms))},     // strict
		{400 * ms, time.Minute, time.Duration(starveLimit(400 * ms))},     // never past starveLimit
	} {
		if got := time.Duration(starveCapOf(c.detect, c.share)); got != c.want {
			t.Errorf("starveCapOf(%v, %v) = %v, want %v", c.detect, c.share, got, c.want)
		}
	}
}
