package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/worker/benchmark"
)

func TestScratchDip(t *testing.T) {
	if os.Getenv("SCRATCH") == "" {
		t.Skip()
	}
	ctx := context.Background()
	setWorkerGC(400)
	cfg := benchmark.ReconfigConfig{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), Updates: 4}
	cfg.Defaults()
	cfg.Spacing = 3e9
	cfg.Warmup = 25e8
	o, err := startReconfigOrg(ctx, cfg.Logger)
	if err != nil {
		t.Fatal(err)
	}
	defer o.close()
	res, err := orgStrategy(ctx, o, cfg, fsm.StrategyLive)
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range res.UpdatesAtMs {
		fmt.Printf("update %d at %.0f: switched +%.0f complete +%.0f\n", i, u, res.SwitchedMs[i], res.CompleteMs[i])
		for _, b := range res.Buckets {
			if b.AtMs >= u-300 && b.AtMs <= u+1200 {
				fmt.Printf("  %6.0f %5d %6.1f\n", b.AtMs-u, b.Tuples, b.LatencyMs)
			}
		}
	}
}
