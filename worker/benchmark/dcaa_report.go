package benchmark

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/fedstream/fedstream/internal/benchreport"
)

// Charts draws tentative results against D/X for each strategy, with the
// floor's bound 1.1 × rate × (D − 0.9X) where it applies (D > X).
func (r *DCAAResult) Charts() []benchreport.Chart {
	c := benchreport.Chart{
		Title:  fmt.Sprintf("bench dcaa: tentative results vs failure duration (X = %.0f ms, %.0f results/s)", r.XMs, r.Rate),
		XLabel: "D / X",
		YLabel: "tentative results",
	}
	index := map[string]int{} // strategy -> its series in c.Series
	var bound benchreport.Series
	bound.Name = "floor: 1.1 x rate x (D - 0.9X)"
	for _, row := range r.Rows {
		i, ok := index[row.Strategy]
		if !ok {
			i = len(c.Series)
			index[row.Strategy] = i
			c.Series = append(c.Series, benchreport.Series{Name: row.Strategy})
		}
		s := &c.Series[i]
		s.X = append(s.X, row.DOverX)
		s.Y = append(s.Y, float64(row.Tentative))
		if row.TentativeBound > 0 {
			bound.X = append(bound.X, row.DOverX)
			bound.Y = append(bound.Y, row.TentativeBound)
		}
	}
	if len(bound.Y) > 0 {
		c.Series = append(c.Series, bound)
	}
	return []benchreport.Chart{c}
}

// WriteText prints the result for people: the figures, one line per row,
// and the floors.
func (r *DCAAResult) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "X %.0f ms, boundary interval %.0f ms, detection %.0f ms; input %d records/s, %.1f results/s (reference: %d results)\n",
		r.XMs, r.BoundaryMs, r.DetectMs, r.InputRate, r.Rate, r.ReferenceResults)
	switch r.OverheadMethod {
	case OverheadDCAAPaired:
		match := r.SaturationOutputsMatch != nil && *r.SaturationOutputsMatch
		fmt.Fprintf(tw, "replication overhead %.1f%% +- %.1f%% (95%% interval), median round %.1f%%, rounds %v (%s; load average %s)\n",
			r.ReplicationOverhead*100, r.ReplicationOverheadCI95*100, r.ReplicationOverheadMedian*100, r.CPUOverheadRounds, r.OverheadNote, r.OverheadLoad)
		fmt.Fprintf(tw, "  median rounds: per CPU-second k=1 %s, k=2 %s; k=2 sinks: %d tentative, %d UNDO; every sink's stable output equals k=1's (%d results): %t %s\n",
			benchreport.Rate(r.K1RecordsPerCPUSec, "records"), benchreport.Rate(r.K2RecordsPerCPUSec, "records"),
			r.SaturationTentative, r.SaturationUndos, r.SaturationResults, match, r.SaturationMismatch)
	case OverheadDCAASide:
		fmt.Fprintf(tw, "replication overhead %.1f%% +- %.1f%% (95%% interval), median window %.1f%%, round means %v (%s; load average %s)\n",
			r.ReplicationOverhead*100, r.ReplicationOverheadCI95*100, r.ReplicationOverheadMedian*100, r.OverheadRoundMeans, r.OverheadNote, r.OverheadLoad)
		fmt.Fprintf(tw, "  median windows: per CPU-second k=1 %s, k=2 %s\n", benchreport.Rate(r.K1RecordsPerCPUSec, "records"), benchreport.Rate(r.K2RecordsPerCPUSec, "records"))
	default:
		r.writeSequentialOverhead(tw)
	}
	fmt.Fprintf(tw, "switch %.0f ms (normal rhythm %.0f ms, %d tentative after the kill)\n\n", r.SwitchMs, r.NormalGapMs, r.SwitchTentative)
	fmt.Fprintln(tw, "strategy\tD/X\tD ms\ttentative\tafter heal\tbound\tUNDO\tcorrected ms\tmax added latency ms\tstable = reference")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%g\t%.0f\t%d\t%d\t%.0f\t%d\t%.0f\t%.0f\t%t\n", row.Strategy, row.DOverX, row.DMs, row.Tentative, row.TentativeAfterHeal,
			row.TentativeBound, row.Undos, row.CorrectedMs, row.MaxAddedLatencyMs, row.StableMatchesReference)
	}
	fmt.Fprintln(tw)
	for _, f := range r.Floors {
		mark := "holds"
		if !f.Holds {
			mark = "FAILS"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", mark, f.Name, f.Detail)
	}
	return tw.Flush()
}

// writeSequentialOverhead prints the sequential method's figures.
func (r *DCAAResult) writeSequentialOverhead(tw io.Writer) {
	match := r.SaturationOutputsMatch != nil && *r.SaturationOutputsMatch
	fmt.Fprintf(tw, "replication overhead %.1f%% (%s: %s; load average %s)\n", r.ReplicationOverhead*100, r.OverheadMethod, r.OverheadNote, r.OverheadLoad)
	fmt.Fprintf(tw, "  medians of %d pairs: at the slower sink k=1 %s, k=2 %s (%.1f%%, pairs %v; CPU use per replica %.2f and %.2f); per CPU-second per replica: k=1 %s, k=2 %s (%.1f%%, pairs %v)\n",
		len(r.OverheadRounds), benchreport.Rate(r.K1RecordsPerSec, "records"), benchreport.Rate(r.K2RecordsPerSec, "records"), r.SinkOverhead*100, r.OverheadRounds, r.K1CPUUse, r.K2CPUUse,
		benchreport.Rate(r.K1RecordsPerCPUSec, "records"), benchreport.Rate(r.K2RecordsPerCPUSec, "records"), r.CPUOverhead*100, r.CPUOverheadRounds)
	fmt.Fprintf(tw, "  k=2 sinks: %d tentative, %d UNDO; every sink's stable output equals k=1's (%d results): %t %s\n",
		r.SaturationTentative, r.SaturationUndos, r.SaturationResults, match, r.SaturationMismatch)
}
