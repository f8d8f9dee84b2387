package reports

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// WindowMargin is where a fault sat in its operation window: the window's
// edges relative to the trigger's hit as measured on the case's own stack
// before the fault was armed, the fault's time on the same axis, and its
// distance to each edge. A small margin is a verdict that can flip with the
// machine's speed (issue #19).
type WindowMargin struct {
	Open  string `json:"open"`  // the point that opens the window
	Close string `json:"close"` // the point that closes it
	// StartMs and EndMs are the edges after the trigger's hit: the latest
	// start and the earliest end over the calibration runs.
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
	// SpreadMs is how far the end edge moved between calibration runs.
	SpreadMs float64 `json:"spread_ms"`
	Source   string  `json:"source,omitempty"`
	// PlannedMs is the fault's scaled offset after the trigger; FaultMs
	// when it fired in this run (0 with Fired false: it never fired).
	PlannedMs float64 `json:"planned_ms"`
	FaultMs   float64 `json:"fault_ms"`
	Fired     bool    `json:"fired"`
	// MarginStartMs = fault − start edge (the start as observed in this run
	// when it was hit); MarginEndMs = end edge − fault (observed when the
	// run reached it before the fault, else the measured edge). Negative:
	// outside the window.
	MarginStartMs float64 `json:"margin_start_ms"`
	MarginEndMs   float64 `json:"margin_end_ms"`
	// EndObserved: this run reached the end edge before the fault (the
	// fault missed); otherwise MarginEndMs is against the measured edge,
	// the headroom left had this run been as fast as its fastest
	// calibration.
	EndObserved bool `json:"end_observed,omitempty"`
}

// MinMs is the fault's distance to the nearer edge.
func (w *WindowMargin) MinMs() float64 { return math.Min(w.MarginStartMs, w.MarginEndMs) }

// MarginLabel is the margin as reports show it; a parked or steady-state
// fault has no timing edge to be near.
func (c *Case) MarginLabel() string {
	w := c.Window
	if w == nil {
		switch {
		case strings.HasPrefix(strings.TrimSpace(c.Trigger), "park"):
			return "exact (parked)" // held at its point: no timing edge
		case strings.HasPrefix(strings.TrimSpace(c.Trigger), "now"):
			return "steady state"
		}
		return "-"
	}
	if !w.Fired {
		return fmt.Sprintf("planned at %s in %s..%s (not fired)", FormatMs(w.PlannedMs), FormatMs(w.StartMs), FormatMs(w.EndMs))
	}
	end := signedMs(w.MarginEndMs)
	if !w.EndObserved {
		end += " (measured edge)"
	}
	return fmt.Sprintf("start %s / end %s", signedMs(w.MarginStartMs), end)
}

func signedMs(ms float64) string {
	if ms < 0 {
		return "−" + FormatMs(-ms)
	}
	return "+" + FormatMs(ms)
}

// RunOutcome is one run of a case under `vmchaos run --repeat N`.
type RunOutcome struct {
	Verdict     string        `json:"verdict"`
	Reason      string        `json:"reason,omitempty"`
	LandedPhase string        `json:"landed_phase,omitempty"`
	Window      *WindowMargin `json:"window,omitempty"`
	DurationMs  float64       `json:"duration_ms"`
	ConvergeMs  float64       `json:"converge_ms"`
	Repro       string        `json:"repro,omitempty"`
}

// JoinRuns turns the runs of one case into its reported record. With one
// run it is that run. With several, the verdict is theirs when they all
// agree, else Flaky; the record shown (evidence, timeline, logs) is the
// first run that did not pass, so a flaky case shows why it flipped; every
// run's outcome is kept in Runs.
func JoinRuns(runs []Case) Case {
	if len(runs) == 0 {
		return Case{}
	}
	if len(runs) == 1 {
		return runs[0]
	}
	rep := 0
	for i, r := range runs {
		if r.Verdict != Pass {
			rep = i
			break
		}
	}
	out := runs[rep]
	out.Runs = nil
	out.DurationMs = 0
	same := true
	for _, r := range runs {
		out.Runs = append(out.Runs, RunOutcome{Verdict: r.Verdict, Reason: r.Reason, LandedPhase: r.LandedPhase,
			Window: r.Window, DurationMs: r.DurationMs, ConvergeMs: r.ConvergeMs, Repro: r.Repro})
		out.DurationMs += r.DurationMs
		same = same && r.Verdict == runs[0].Verdict
	}
	// the worst margin of any run is the one that says how close it came
	for _, r := range runs {
		if r.Window != nil && r.Window.Fired && (out.Window == nil || !out.Window.Fired || r.Window.MinMs() < out.Window.MinMs()) {
			out.Window = r.Window
		}
	}
	if !same {
		out.Verdict = Flaky
		out.Reason = fmt.Sprintf("verdicts differ across %d runs (%s); run %d: %s: %s", len(runs), RunTally(out.Runs),
			rep+1, runs[rep].Verdict, orDefault(runs[rep].Reason, "-"))
	}
	return out
}

// RunTally counts run verdicts: "pass×4, inconclusive×1", in verdict order.
func RunTally(runs []RunOutcome) string {
	n := map[string]int{}
	for _, r := range runs {
		n[r.Verdict]++
	}
	var parts []string
	for _, v := range []string{Pass, Fail, Inconclusive, Error} {
		if n[v] > 0 {
			parts = append(parts, fmt.Sprintf("%s×%d", v, n[v]))
			delete(n, v)
		}
	}
	for _, v := range sortedKeys(n) {
		parts = append(parts, fmt.Sprintf("%s×%d", v, n[v]))
	}
	return strings.Join(parts, ", ")
}

// flakyCode is the gate code of a flaky case: the most severe of its runs'
// verdicts, and never better than inconclusive (a flaky case proves nothing
// stable).
func flakyCode(c Case) int {
	code := GateInconclusive
	for _, r := range c.Runs {
		k := GatePass
		switch r.Verdict {
		case Fail:
			k = GateFail
		case Error:
			k = GateInfra
		case Inconclusive:
			k = GateInconclusive
		}
		if severity(k) > severity(code) {
			code = k
		}
	}
	return code
}

// StabilityFigures are what `make stability` prints: over several run dirs
// of the same selection, how many cases, how many flipped (a case whose
// verdicts differ between any two of its runs, within or across the dirs),
// and the smallest fault-to-window-edge margin seen.
type StabilityFigures struct {
	Cases, Runs   int
	Flipped       []string // "id: pass×9, inconclusive×1"
	NotPass       []string // cases that never flipped but did not pass
	WorstMarginMs float64
	WorstCase     string
	Measured      int // case runs with a measured window and a fired fault
}

// Stability computes StabilityFigures over results (each possibly run with
// --repeat).
func Stability(rs ...*Results) StabilityFigures {
	var f StabilityFigures
	runs := map[string][]RunOutcome{}
	var order []string
	f.WorstMarginMs = math.Inf(1)
	for _, r := range rs {
		for _, c := range r.Cases {
			outs := c.Runs
			if len(outs) == 0 {
				outs = []RunOutcome{{Verdict: c.Verdict, Window: c.Window}}
			}
			if _, ok := runs[c.ID]; !ok {
				order = append(order, c.ID)
			}
			runs[c.ID] = append(runs[c.ID], outs...)
			f.Runs += len(outs)
			for _, o := range outs {
				if w := o.Window; w != nil && w.Fired {
					f.Measured++
					if w.MinMs() < f.WorstMarginMs {
						f.WorstMarginMs, f.WorstCase = w.MinMs(), c.ID
					}
				}
			}
		}
	}
	sort.Strings(order)
	f.Cases = len(order)
	for _, id := range order {
		outs := runs[id]
		flip := false
		for _, o := range outs {
			flip = flip || o.Verdict != outs[0].Verdict
		}
		switch {
		case flip:
			f.Flipped = append(f.Flipped, id+": "+RunTally(outs))
		case outs[0].Verdict != Pass:
			f.NotPass = append(f.NotPass, id+": "+RunTally(outs))
		}
	}
	if f.Measured == 0 {
		f.WorstMarginMs = math.NaN()
	}
	return f
}

// Write prints the figures, one fact a line.
func (f StabilityFigures) Write(w io.Writer) {
	fmt.Fprintf(w, "stability: %d cases, %d case runs, %d flipped\n", f.Cases, f.Runs, len(f.Flipped))
	for _, s := range f.Flipped {
		fmt.Fprintf(w, "  FLIPPED %s\n", s)
	}
	for _, s := range f.NotPass {
		fmt.Fprintf(w, "  NOT PASS (stable) %s\n", s)
	}
	if f.Measured == 0 {
		fmt.Fprintln(w, "  worst margin: no case with a measured window fired")
		return
	}
	fmt.Fprintf(w, "  worst margin between a fault and its window edge: %s (%s), over %d case runs with a measured window\n",
		signedMs(f.WorstMarginMs), f.WorstCase, f.Measured)
}

// prefixed is p+s, or "" for an empty s.
func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}
