package benchreport

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one line of a chart: Y[i] is the figure of round i+1, or,
// when X is set (as long as Y), the figure at X[i].
type Series struct {
	Name string
	Y    []float64
	X    []float64
}

// Line is a horizontal reference line (a floor, a goal).
type Line struct {
	Name string
	Y    float64
}

// Chart is one panel of a PNG: series drawn against the round number.
type Chart struct {
	Title  string
	YLabel string
	// XLabel defaults to "round".
	XLabel string
	Series []Series
	// Lines are drawn dashed across the chart, with their names in the
	// legend.
	Lines []Line
	// LogY draws the Y axis on a log scale (for rates of different
	// orders of magnitude); ignored unless every value is positive.
	LogY bool
}

// ErrNothingToPlot means WritePNG was given no chart with a value.
var ErrNothingToPlot = errors.New("benchreport: nothing to plot")

// Size of one chart panel in pixels (96 dpi); a PNG stacks its charts
// vertically.
const (
	panelWidthPx  = 900
	panelHeightPx = 380
	dpi           = 96
)

// WritePNG draws charts one above the other into a PNG file at path.
func WritePNG(path string, charts ...Chart) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("plot: %w", cerr)
		}
	}()
	return EncodePNG(f, charts...)
}

// EncodePNG draws charts one above the other as a PNG on w.
func EncodePNG(w io.Writer, charts ...Chart) error {
	var plots [][]*plot.Plot
	for _, c := range charts {
		if !c.hasValues() {
			continue
		}
		p, err := c.plot()
		if err != nil {
			return err
		}
		plots = append(plots, []*plot.Plot{p})
	}
	if len(plots) == 0 {
		return ErrNothingToPlot
	}
	px := func(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }
	img := vgimg.NewWith(vgimg.UseWH(px(panelWidthPx), px(panelHeightPx*len(plots))), vgimg.UseDPI(dpi),
		vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 3}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

func (c Chart) hasValues() bool {
	for _, s := range c.Series {
		if len(s.Y) > 0 {
			return true
		}
	}
	return false
}

func (c Chart) positive() bool {
	for _, s := range c.Series {
		if slices.ContainsFunc(s.Y, func(y float64) bool { return y <= 0 }) {
			return false
		}
	}
	for _, l := range c.Lines {
		if l.Y <= 0 {
			return false
		}
	}
	return true
}

func (c Chart) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	if p.X.Label.Text == "" {
		p.X.Label.Text = "round"
	}
	p.Y.Label.Text = c.YLabel
	p.Legend.Top = true
	p.Legend.Left = true
	logY := c.LogY && c.positive()
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = siLogTicks{}
	} else {
		p.Y.Tick.Marker = siTicks{}
	}
	p.Add(plotter.NewGrid())
	rounds := 0
	valued := false // some series has its own X values
	for i, s := range c.Series {
		if len(s.Y) == 0 {
			continue
		}
		rounds = max(rounds, len(s.Y))
		xys := make(plotter.XYs, len(s.Y))
		for r, y := range s.Y {
			xys[r] = plotter.XY{X: float64(r + 1), Y: y}
			if len(s.X) == len(s.Y) {
				xys[r].X, valued = s.X[r], true
			}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("plot %q, series %q: %w", c.Title, s.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(s.Name, line, points)
	}
	for i, l := range c.Lines {
		ref := plotter.NewFunction(func(float64) float64 { return l.Y })
		ref.Color = color.Gray{Y: 90}
		ref.Dashes = plotutil.Dashes(i + 1)
		ref.Width = vg.Points(1)
		p.Add(ref)
		p.Legend.Add(l.Name, ref)
	}
	if !valued {
		// Whole rounds on the X axis, with a little room either side.
		p.X.Min, p.X.Max = 0.8, float64(rounds)+0.2
		p.X.Tick.Marker = roundTicks{}
	}
	for _, l := range c.Lines {
		p.Y.Min, p.Y.Max = min(p.Y.Min, l.Y), max(p.Y.Max, l.Y)
	}
	// Headroom above the data for the legend (top left): one line of
	// legend takes about 1/16 of the panel's height; the legend must
	// clear the data with a margin.
	entries := float64(len(c.Series) + len(c.Lines))
	if logY {
		p.Y.Min /= 1.5
		p.Y.Max *= math.Pow(p.Y.Max/p.Y.Min, entries/10)
	} else {
		p.Y.Min = 0
		p.Y.Max *= 1 + entries/8
	}
	return p, nil
}

// siLogTicks marks 1, 2 and 5 times each power of ten, labelled with SI
// prefixes (500k, 1M, 2M); over a range too narrow for three of those, it
// marks the linear axis's ticks instead.
type siLogTicks struct{}

func (siLogTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: si(v)})
			}
		}
	}
	if len(ts) < 3 {
		return siTicks{}.Ticks(lo, hi)
	}
	return ts
}

// siTicks are gonum's default ticks labelled with SI prefixes.
type siTicks struct{}

func (siTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = si(ts[i].Value)
		}
	}
	return ts
}

// si formats v with an SI prefix and at most 3 significant digits.
func si(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// roundTicks labels every whole round.
type roundTicks struct{}

func (roundTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for r := int(lo + 0.999); float64(r) <= hi; r++ {
		ts = append(ts, plot.Tick{Value: float64(r), Label: fmt.Sprint(r)})
	}
	return ts
}
