package benchreport

import (
	"bytes"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func sampleCharts() []Chart {
	return []Chart{
		{
			Title: "rates", YLabel: "records per second", LogY: true,
			Series: []Series{{Name: "raw", Y: []float64{13e6, 12.5e6, 14e6}}, {Name: "unbatched", Y: []float64{440e3, 420e3, 450e3}}},
		},
		{
			Title: "ratios", YLabel: "ratio",
			Series: []Series{{Name: "forward / raw", Y: []float64{0.35, 0.38, 0.36}}},
			Lines:  []Line{{Name: "floor", Y: 0.25}},
		},
	}
}

// The PNG decodes, and stacks one panel per chart.
func TestWritePNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.png")
	if err := WritePNG(path, sampleCharts()...); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != panelWidthPx || b.Dy() != 2*panelHeightPx {
		t.Fatalf("image %dx%d, want %dx%d (two panels)", b.Dx(), b.Dy(), panelWidthPx, 2*panelHeightPx)
	}
}

// Charts without values are left out; none at all is an error, not an
// empty image. A log chart with a zero falls back to a linear axis.
func TestEncodePNGEdges(t *testing.T) {
	var buf bytes.Buffer
	if err := EncodePNG(&buf, Chart{Title: "empty"}); !errors.Is(err, ErrNothingToPlot) {
		t.Fatalf("no values gave %v, want ErrNothingToPlot", err)
	}
	c := Chart{Title: "zero", LogY: true, Series: []Series{{Name: "s", Y: []float64{0, 5}}}}
	if err := EncodePNG(&buf, c, Chart{Title: "empty"}); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds().Dy() != panelHeightPx {
		t.Fatalf("height %d, want one panel (%d)", img.Bounds().Dy(), panelHeightPx)
	}
}

func TestSI(t *testing.T) {
	for v, want := range map[float64]string{0.25: "0.25", 10: "10", 500e3: "500k", 1e6: "1M", 12.5e6: "12.5M", 2e9: "2G"} {
		if got := si(v); got != want {
			t.Errorf("si(%g) = %q, want %q", v, got, want)
		}
	}
}

// A log axis over less than a decade still gets several labelled ticks.
func TestLogTicksNarrowRange(t *testing.T) {
	labelled := 0
	for _, tk := range (siLogTicks{}).Ticks(2.3e6, 3.9e6) {
		if tk.Label != "" {
			labelled++
		}
	}
	if labelled < 3 {
		t.Fatalf("%d labelled ticks between 2.3M and 3.9M, want at least 3", labelled)
	}
}
