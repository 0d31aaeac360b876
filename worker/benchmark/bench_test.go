package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fedstream/fedstream/internal/benchreport"

	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startInProcess runs a benchmark session with in-process workers.
func startInProcess(t *testing.T, records int64) *bench {
	t.Helper()
	b, err := start(t.Context(), Config{Records: records, Launch: InProcessLauncher(testLogger()), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	return b
}

// referenceWordCount computes the word count directly from the generator,
// with strings.Fields (the split operator's documented rules).
func referenceWordCount(t *testing.T, n int64) map[string]int64 {
	t.Helper()
	gen, err := source.NewGenerator(wordsGenerator(n, benchSeed), 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	var tp tuple.Tuple
	for gen.Next(&tp) {
		for _, w := range strings.Fields(tp.Values[0].S) {
			out[w]++
		}
	}
	return out
}

func TestScenariosInProcess(t *testing.T) {
	const n = 3000
	b := startInProcess(t, n)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	want := referenceWordCount(t, n)

	t.Run("raw_tcp", func(t *testing.T) {
		m, err := b.rawTCP(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if m.records != n || m.bytes != n*RawRecordBytes {
			t.Fatalf("raw TCP: %d records, %d bytes; want %d, %d", m.records, m.bytes, n, n*RawRecordBytes)
		}
	})
	for _, unbatched := range []bool{false, true} {
		t.Run("forward", func(t *testing.T) {
			m, err := b.forward(ctx, n, unbatched)
			if err != nil {
				t.Fatalf("unbatched=%v: %v", unbatched, err)
			}
			// Encoded records of the default blob are 100 bytes from
			// about 2M records on; these small ids are 2-5 bytes shorter.
			if perRecord := float64(m.bytes) / float64(m.records); m.records != n || perRecord < RawRecordBytes-6 || perRecord > RawRecordBytes {
				t.Fatalf("unbatched=%v: %d records, %.1f bytes per record; want %d records of about %d bytes",
					unbatched, m.records, perRecord, n, RawRecordBytes)
			}
		})
	}
	t.Run("wordcount", func(t *testing.T) {
		engine, err := b.engineWordCount(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		hand, err := b.handWordCount(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) < 100 {
			t.Fatalf("reference has only %d distinct words", len(want))
		}
		if !maps.Equal(engine.counts, want) {
			t.Errorf("engine word count differs from the reference:\n got %v\nwant %v", engine.counts, want)
		}
		if !maps.Equal(hand.counts, want) {
			t.Errorf("hand-written word count differs from the reference:\n got %v\nwant %v", hand.counts, want)
		}
	})
}

func TestRunReportsEveryFigure(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "plaintext"}[plain], func(t *testing.T) { runReportsEveryFigure(t, plain) })
	}
}

func runReportsEveryFigure(t *testing.T, plaintext bool) {
	var progress bytes.Buffer
	res, err := Run(t.Context(), Config{Records: 2000, Launch: InProcessLauncher(testLogger()), Logger: testLogger(), Plaintext: plaintext,
		Progress: benchreport.NewProgress(&progress, "bench dataplane")})
	if err != nil {
		t.Fatal(err)
	}
	// One progress line per scenario and round (one round with Records
	// set), and a plot of every figure.
	for _, name := range ScenarioNames {
		if !strings.Contains(progress.String(), name) || !strings.Contains(progress.String(), "round 1/1") {
			t.Errorf("progress lacks %s's round:\n%s", name, progress.String())
		}
	}
	charts := res.Charts()
	if len(charts) != 3 || len(charts[0].Series) != len(ScenarioNames) {
		t.Errorf("%d charts, the first with %d series; want 3, %d", len(charts), len(charts[0].Series), len(ScenarioNames))
	}
	for _, c := range charts {
		for _, s := range c.Series {
			if len(s.Y) != 1 || s.Y[0] <= 0 {
				t.Errorf("chart %q series %q: %v, want one positive figure per round", c.Title, s.Name, s.Y)
			}
		}
	}
	if err := benchreport.EncodePNG(io.Discard, charts...); err != nil {
		t.Errorf("plot: %v", err)
	}
	if res.TLS == plaintext {
		t.Errorf("result says tls=%v for a run with plaintext=%v", res.TLS, plaintext)
	}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"raw_tcp_rps", "forward_rps", "forward_ratio", "wordcount_lines_ps",
		"handwritten_lines_ps", "wordcount_ratio", "unbatched_rps", "batching_gain"} {
		v, ok := fields[k].(float64)
		if !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", k, fields[k])
		}
	}
	if res.Timing == "" || len(res.EngineSettings) == 0 {
		t.Errorf("timing %q and %d engine settings: the result must say how it was timed and configured", res.Timing, len(res.EngineSettings))
	}
	for _, s := range res.EngineSettings {
		if s.Setting == "" || s.Bench == "" || s.Production == "" || s.Why == "" || s.Bench == s.Production {
			t.Errorf("engine setting %+v: want what differs, both values and why", s)
		}
	}
	if len(res.Scenarios) != 5 {
		t.Errorf("%d scenarios, want 5", len(res.Scenarios))
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil || text.Len() == 0 {
		t.Errorf("WriteText: %v, %d bytes", err, text.Len())
	}
}

func TestWorkerProtocolErrors(t *testing.T) {
	p, err := InProcessLauncher(testLogger())(t.Context(), "w")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	c := newWorkerClient("w", p)
	ctx := t.Context()
	if _, err := c.call(ctx, request{Op: opCPU}); err == nil {
		t.Fatal("a request before hello was served")
	}
	if resp, err := c.call(ctx, request{Op: opHello}); err != nil || resp.Addr == "" {
		t.Fatalf("hello: %v, %q", err, resp.Addr)
	}
	tests := []struct {
		name string
		req  request
	}{
		{"unknown op", request{Op: "nope"}},
		{"wait without job", request{Op: opTailWait}},
		{"tail of unknown task", request{Op: opTailStart, Task: "q/out/p0/r0"}},
		{"bad record size", request{Op: opTCPSend, Addr: "127.0.0.1:1", RecordBytes: 0, Records: 1}},
		{"second hello", request{Op: opHello}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.call(ctx, tc.req); err == nil {
				t.Fatal("no error")
			}
		})
	}
	// The worker still answers after errors.
	if resp, err := c.call(ctx, request{Op: opCPU}); err != nil || resp.CPUNanos == 0 {
		t.Fatalf("cpu after errors: %v, %d", err, resp.CPUNanos)
	}
}

func TestReceiveRecordsRejectsTornRecord(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		_, err := receiveRecords(t.Context(), lis, 10, 0)
		done <- err
	}()
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(bytes.Repeat([]byte{recordMarker}, 15)); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	if err := <-done; err == nil {
		t.Fatal("torn record accepted")
	}
}

// BenchmarkForwardInProcess runs the forward pipeline with both workers in
// this process, over mutual TLS as by default (for CPU profiles of the
// engine path, and the process's CPU time per record of both sides):
//
//	go test -run '^$' -bench ForwardInProcess -cpuprofile cpu.out ./worker/benchmark/
func BenchmarkForwardInProcess(b *testing.B) {
	benchInProcess(b, false, func(s *bench, ctx context.Context, n int64) (measurement, error) { return s.forward(ctx, n, false) })
}

// BenchmarkForwardInProcessPlaintext is the same without TLS.
func BenchmarkForwardInProcessPlaintext(b *testing.B) {
	benchInProcess(b, true, func(s *bench, ctx context.Context, n int64) (measurement, error) { return s.forward(ctx, n, false) })
}

// BenchmarkWordCountInProcess is the engine word count, in process.
func BenchmarkWordCountInProcess(b *testing.B) {
	benchInProcess(b, false, (*bench).engineWordCount)
}

// benchInProcess reports the rate and the CPU time the process spent per
// record (both workers together): on a loaded machine the CPU time moves
// less than the rate, and its minimum over runs compares builds.
func benchInProcess(b *testing.B, plaintext bool, run func(*bench, context.Context, int64) (measurement, error)) {
	s, err := start(b.Context(), Config{Records: 1, Launch: InProcessLauncher(testLogger()), Logger: testLogger(), Plaintext: plaintext})
	if err != nil {
		b.Fatal(err)
	}
	defer s.stop()
	const n = 200_000
	var (
		records int64
		elapsed time.Duration
		cpu     = processCPUNanos()
	)
	b.ResetTimer()
	for b.Loop() {
		m, err := run(s, b.Context(), n)
		if err != nil {
			b.Fatal(err)
		}
		records += m.records
		elapsed += m.elapsed
	}
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(processCPUNanos()-cpu)/float64(records), "cpu-ns/record")
}

// TestNextWordMatchesFields: the hand-written tokeniser splits like
// strings.Fields (and so like the split operator).
func TestNextWordMatchesFields(t *testing.T) {
	for _, line := range []string{
		"", " ", "a", "the quick  brown fox", "  lead and trail  ", "tab\tnew\nline\r\v\f",
		"non\u00a0breaking\u2003em space", "caf\u00e9 na\u00efve", "bad\xffutf8 \xff", "\u3000ideographic\u3000",
	} {
		var got []string
		for s, e := operator.NextToken(line, 0); s < e; s, e = operator.NextToken(line, e) {
			got = append(got, line[s:e])
		}
		if want := strings.Fields(line); !slices.Equal(got, want) {
			t.Errorf("NextToken(%q) = %q, want %q", line, got, want)
		}
	}
}
